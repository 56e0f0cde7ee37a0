"""The ``ray`` executor: each unit a Ray task with its own resources and retries.

Connects to the cluster at ``RAY_ADDRESS`` when it is set, else starts a local single-node
cluster of ``executor.workers`` CPUs (the machine's cores when 0) for this sweep; a Ray session
the caller already started is used as it is. Units that load a model ask for
``executor.gpus_per_unit`` GPUs, every unit for ``cpus_per_unit`` CPUs and ``memory_gb``. Ray
retries a unit whose task raised or whose worker died (``executor.retries`` times); the
environment a worker needs before it imports anything (offline mode, caches, thread counts)
travels in the job's runtime environment.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray

from tangentlens.sweep.executors.base import (
    Finished,
    UnitEvent,
    UnitFailure,
    error_line,
    schedule,
    worker_env,
)
from tangentlens.sweep.plan import Plan, Unit
from tangentlens.sweep.recipe import Recipe
from tangentlens.sweep.units import UnitReport, run_unit, unit_log

__all__ = ["RayBackend", "run_on_ray"]


def _run(recipe: Recipe, root: str, unit: Unit) -> UnitReport:
    return run_unit(recipe, root, unit)


class RayBackend:
    """Submits each unit as a Ray task; Ray queues them on the cluster's free resources."""

    capacity = 1 << 30

    def __init__(self, recipe: Recipe, root: str | Path) -> None:
        self.recipe, self.root = recipe, str(Path(root).resolve())
        self.task = ray.remote(_run)
        self.refs: dict[Any, tuple[Unit, float]] = {}

    def _options(self, unit: Unit) -> dict[str, Any]:
        spec = self.recipe.executor
        options: dict[str, Any] = {
            "num_cpus": spec.cpus_per_unit,
            "num_gpus": spec.gpus_per_unit if unit.model else 0,
            "max_retries": spec.retries,
            "retry_exceptions": True,
            "name": unit.name,
        }
        if spec.memory_gb:
            options["memory"] = int(spec.memory_gb * 2**30)
        return options

    def submit(self, units: Sequence[Unit]) -> None:
        for unit in units:
            ref = self.task.options(**self._options(unit)).remote(self.recipe, self.root, unit)
            self.refs[ref] = (unit, time.perf_counter())

    def wait(self, timeout: float) -> list[Finished]:
        if not self.refs:
            return []
        ready, _ = ray.wait(list(self.refs), num_returns=1, timeout=timeout)
        if ready:  # and whatever else has finished meanwhile
            ready, _ = ray.wait(list(self.refs), num_returns=len(self.refs), timeout=0)
        out = []
        for ref in ready:
            unit, started = self.refs.pop(ref)
            seconds = time.perf_counter() - started
            try:
                ray.get(ref)
            except ray.exceptions.RayTaskError as error:
                cause = error.cause if error.cause is not None else error
                log = str(unit_log(self.root, unit.name))
                out.append(Finished(unit, error_line(cause), log, seconds))
            except ray.exceptions.RayError as error:  # the worker died, retries spent
                out.append(Finished(unit, error_line(error), "the Ray worker logs", seconds))
            else:
                out.append(Finished(unit, seconds=seconds))
        return out


def run_on_ray(
    recipe: Recipe, plan: Plan, root: str | Path, emit: Callable[[UnitEvent], None]
) -> list[UnitFailure]:
    """Run the pending units of ``plan`` on Ray (see the module docstring)."""
    started_here = not ray.is_initialized()
    if started_here:
        runtime_env = {"env_vars": worker_env(recipe.capture.threads)}
        if os.environ.get("RAY_ADDRESS"):
            ray.init(runtime_env=runtime_env, log_to_driver=False)
        else:
            cpus = recipe.executor.workers or os.cpu_count() or 1
            ray.init(
                num_cpus=cpus,
                runtime_env=runtime_env,
                include_dashboard=False,
                log_to_driver=False,
            )
    try:
        # Ray retries (executor.retries): the scheduler reports what still failed
        return schedule(plan, root, RayBackend(recipe, root), retries=0, emit=emit)
    finally:
        if started_here:
            ray.shutdown()
