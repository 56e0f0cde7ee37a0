"""Executors: where a sweep's units run (``[executor] kind`` in a recipe, ``--executor``).

* ``local`` — in this process, one unit at a time (the default);
* ``ray`` — Ray tasks with per-unit resources and retries, on the cluster at ``RAY_ADDRESS`` or
  on a local one this sweep starts (:mod:`~tangentlens.sweep.executors.ray`);
* ``slurm`` — submitit job arrays on a Slurm cluster, with ``--detach`` (dependent jobs,
  collected by a later ``--resume``) (:mod:`~tangentlens.sweep.executors.submitit`);
* ``submitit-local`` — the same submitit jobs as local processes, at most ``workers`` at once.

Engines are optional extras (``pip install 'tangentlens[ray]'`` / ``'tangentlens[slurm]'``),
imported only when chosen.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from tangentlens.core.recipe import EXECUTOR_KINDS, Recipe
from tangentlens.core.resolve import RunPlan
from tangentlens.sweep.executors.base import UnitEvent, UnitFailure, schedule
from tangentlens.sweep.plan import Plan

__all__ = ["EXECUTOR_KINDS", "SLURM_TOOLS", "check_executor", "execute"]

#: The Slurm commands the ``slurm`` executor runs: submission, the job step, the queue.
SLURM_TOOLS: tuple[str, ...] = ("sbatch", "srun", "squeue")


def check_executor(recipe: Recipe, *, detach: bool = False) -> None:
    """Refuse, before a run directory is made, what this machine cannot run: ``--detach`` off
    Slurm, or ``executor.kind = 'slurm'`` without :data:`SLURM_TOOLS` on PATH (ValueError)."""
    kind = recipe.executor.kind
    if detach and kind != "slurm":
        raise ValueError(
            f"--detach submits dependent Slurm jobs: it needs executor.kind = 'slurm', got {kind!r}"
        )
    if kind != "slurm":
        return
    missing = [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]
    if missing:
        raise ValueError(
            f"executor.kind = 'slurm' needs Slurm's {', '.join(SLURM_TOOLS)} on PATH, not found: "
            f"{', '.join(missing)}; start a local cluster with `scripts/slurm_localhost.sh start`, "
            "or use executor.kind = 'local' | 'ray' | 'submitit-local'"
        )


def execute(
    run: RunPlan,
    plan: Plan,
    root: str | Path,
    emit: Callable[[UnitEvent], None],
    *,
    detach: bool = False,
) -> list[UnitFailure]:
    """Run the pending units of ``plan`` in ``root`` on the recipe's executor, each given the
    resolved recipe ``run``; returns the units that failed (after retries) or were not run
    because a dependency failed."""
    spec = run.recipe.executor
    if spec.kind == "local":
        from tangentlens.sweep.executors.local import LocalBackend

        backend = LocalBackend(run, root, emit)
        return schedule(plan, root, backend, retries=spec.retries, emit=emit)
    try:
        if spec.kind == "ray":
            from tangentlens.sweep.executors.ray import run_on_ray

            return run_on_ray(run, plan, root, emit)
        from tangentlens.sweep.executors.submitit import run_on_submitit
    except ModuleNotFoundError as error:
        if error.name not in _EXTRAS.values():
            raise
        extra = next(e for e, module in _EXTRAS.items() if module == error.name)
        raise ValueError(
            f"executor.kind = {spec.kind!r} needs {error.name}, which is not installed: "
            f"pip install 'tangentlens[{extra}]'"
        ) from None
    return run_on_submitit(run, plan, root, emit, detach=detach)


#: Optional extra → the engine module it installs.
_EXTRAS = {"ray": "ray", "slurm": "submitit"}
