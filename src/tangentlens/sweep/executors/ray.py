"""The ``ray`` executor: each unit a Ray task with its own resources and retries.

Connects to the cluster at ``RAY_ADDRESS`` when it is set, else starts a local single-node
cluster for this sweep, sized for ``executor.workers`` units at once (0: as many as the cores
hold); a Ray session the caller already started is used as it is. Units that load a model ask
for ``executor.gpus_per_unit`` GPUs, every unit for ``cpus_per_unit`` CPUs (at least the
recipe's ``capture.threads``) and ``memory_gb``. Ray
retries a unit whose worker died (``executor.retries`` times); a unit whose task raised is
retried by the scheduler unless a retry cannot change its error (a configuration error, a
missing file: :func:`~tangentlens.sweep.units.retryable`); the
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

from tangentlens.core.recipe import Recipe
from tangentlens.sweep.executors.base import (
    Finished,
    UnitEvent,
    UnitFailure,
    concurrent_units,
    error_line,
    schedule,
    unit_cpus,
    worker_env,
)
from tangentlens.sweep.plan import Plan, Unit
from tangentlens.sweep.units import UnitReport, failure_log, retryable, run_unit

__all__ = ["RayBackend", "run_on_ray"]


def _run(recipe: Recipe, root: str, unit: Unit) -> UnitReport:
    return run_unit(recipe, root, unit)


class RayBackend:
    """Submits each unit as a Ray task, as many at once as the cluster has CPUs for (the rest
    wait in the coordinator, so the progress shows them queued, not running)."""

    def __init__(self, recipe: Recipe, root: str | Path) -> None:
        self.recipe, self.root = recipe, str(Path(root).resolve())
        cpus = ray.cluster_resources().get("CPU", 1)
        self.capacity = max(int(cpus) // unit_cpus(recipe), 1)
        self.task = ray.remote(_run)
        self.refs: dict[Any, tuple[Unit, float]] = {}

    def _options(self, unit: Unit) -> dict[str, Any]:
        spec = self.recipe.executor
        options: dict[str, Any] = {
            "num_cpus": unit_cpus(self.recipe),
            "num_gpus": spec.gpus_per_unit if unit.model else 0,
            "max_retries": spec.retries,  # a worker that died; errors: the scheduler's
            "retry_exceptions": False,
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
                report = ray.get(ref)
            except ray.exceptions.RayTaskError as error:
                cause = error.cause if error.cause is not None else error
                log = failure_log(self.root, unit.name)
                retry = retryable(cause)
                out.append(Finished(unit, error_line(cause), log, seconds, retry=retry))
            except ray.exceptions.RayError as error:  # the worker died, Ray's retries spent
                log = "the Ray worker logs"
                out.append(Finished(unit, error_line(error), log, seconds, retry=False))
            else:
                out.append(Finished(unit, seconds=seconds, work=report.seconds))
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
            ray.init(
                num_cpus=concurrent_units(recipe) * unit_cpus(recipe),
                runtime_env=runtime_env,
                include_dashboard=False,
                log_to_driver=False,
            )
    try:
        backend = RayBackend(recipe, root)
        return schedule(plan, root, backend, retries=recipe.executor.retries, emit=emit)
    finally:
        if started_here:
            ray.shutdown()
