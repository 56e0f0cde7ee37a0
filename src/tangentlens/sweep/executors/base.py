"""What every executor shares: progress events, failures, and the coordinator-side scheduler.

The scheduler hands a :class:`Backend` the units whose dependencies are done, as many as the
backend can run at once, waits for any to finish, retries a failed unit up to ``retries``
times unless a retry cannot change its error (:attr:`Finished.retry`: a configuration error, a
missing file), and reports the rest: a unit that still fails is a :class:`UnitFailure`, and the
units that depend on it are not run (a later ``--resume`` runs them). While a unit runs, its marker
``units/<unit>.json`` (written by the unit on its worker) names the worker in the progress.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tangentlens.core.recipe import Recipe
from tangentlens.runtime import runtime_env, usable_cpus
from tangentlens.sweep.plan import Plan, Unit

__all__ = [
    "WORKER_ENV_VARS",
    "Backend",
    "Finished",
    "UnitEvent",
    "UnitFailure",
    "concurrent_units",
    "error_line",
    "schedule",
    "unit_cpus",
    "worker_env",
]

#: Environment variables a worker needs before it imports transformers or torch (offline mode,
#: caches); they travel with every unit, through the engine's job environment.
WORKER_ENV_VARS: tuple[str, ...] = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_HOME",
    "HF_HUB_CACHE",
    "TANGENTLENS_CACHE",
    "XDG_CACHE_HOME",
)


def unit_cpus(recipe: Recipe) -> int:
    """CPUs a unit asks for: ``executor.cpus_per_unit``, at least the recipe's thread count
    (two units sharing a core spin-wait on each other's threads: measured 10-50× slower)."""
    return max(recipe.executor.cpus_per_unit, recipe.capture.threads)


def concurrent_units(recipe: Recipe) -> int:
    """How many units run at once on one machine: ``executor.workers``, else as many as the
    CPUs this process may use (:func:`tangentlens.runtime.usable_cpus`: affinity and cgroup
    quota) hold at :func:`unit_cpus` each."""
    return recipe.executor.workers or max(usable_cpus() // unit_cpus(recipe), 1)


def worker_env(threads: int) -> dict[str, str]:
    """The environment every unit runs with: :data:`WORKER_ENV_VARS` and the threading runtime's
    settings (:func:`tangentlens.runtime.runtime_env`, e.g. ``OMP_WAIT_POLICY``) as set here,
    and the recipe's thread count for the OpenMP / MKL / OpenBLAS pools."""
    env = {name: os.environ[name] for name in WORKER_ENV_VARS if name in os.environ}
    env.update(runtime_env())
    for pool in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[pool] = str(threads)
    return env


@dataclass(frozen=True)
class UnitEvent:
    """Progress of one unit. ``phase``: "queued", "running" (``worker`` = host:pid), "status"
    (what it is doing, in ``detail``; in-process units only), "retry", "done" (``seconds`` from
    submission to done as the coordinator saw it, ``work`` the unit's own run time on its
    worker: the difference is the executor's overhead), "failed" (``detail`` = the error) or
    "skipped" (``detail`` = the failed dependency)."""

    phase: str
    unit: str
    worker: str = ""
    detail: str = ""
    seconds: float = 0.0
    work: float = 0.0


@dataclass(frozen=True)
class UnitFailure:
    """A unit that failed after its retries (or was not run because a dependency failed):
    one line of ``error`` and where its full log is."""

    unit: str
    error: str
    log: str


@dataclass(frozen=True)
class Finished:
    """A unit the backend saw finish: ``error`` is None on success, else one line, with the
    full log at ``log``; ``seconds`` from submission to now, ``work`` the time the unit itself
    reported (0 when it failed); ``retry``: whether running it again could end otherwise
    (False for an error the same inputs give again, see
    :func:`tangentlens.sweep.units.retryable`, or one the engine already retried)."""

    unit: Unit
    error: str | None = None
    log: str = ""
    seconds: float = 0.0
    work: float = 0.0
    retry: bool = True


Emit = Callable[[UnitEvent], None]


class Backend(Protocol):
    """Runs units somewhere: :meth:`submit` starts them, :meth:`wait` returns those that
    finished (blocking up to ``timeout`` seconds for at least one)."""

    capacity: int

    def submit(self, units: Sequence[Unit]) -> None: ...

    def wait(self, timeout: float) -> list[Finished]: ...


def _worker(root: Path, unit: str) -> str:
    try:
        marker = json.loads((root / "units" / f"{unit}.json").read_text())
        job = f" (job {marker['job']})" if "job" in marker else ""
        return f"{marker['host']}:{marker['pid']}{job}"
    except (OSError, ValueError, KeyError):
        return ""


def schedule(
    plan: Plan,
    root: str | Path,
    backend: Backend,
    *,
    retries: int,
    emit: Emit,
    poll: float = 0.5,
    running: Sequence[Unit] = (),
) -> list[UnitFailure]:
    """Run every pending unit of ``plan`` in ``root`` through ``backend``; ``running``: units
    already submitted (a resumed detached run) to wait for rather than resubmit."""
    root = Path(root)
    adopted = {u.name for u in running}
    waiting = [u for u in plan.pending(root) if u.name not in adopted]
    done = {u.name for u in plan.units} - {u.name for u in waiting} - adopted
    in_flight: dict[str, str] = {u.name: "" for u in running}  # unit → worker shown
    attempts: dict[str, int] = {}
    failures: list[UnitFailure] = []
    failed: set[str] = set()
    for unit in waiting:
        emit(UnitEvent("queued", unit.name))
    while waiting or in_flight:
        for unit in [u for u in waiting if failed & set(u.deps)]:
            waiting.remove(unit)
            failed.add(unit.name)
            cause = sorted(failed & set(unit.deps))[0]
            emit(UnitEvent("skipped", unit.name, detail=cause))
            failures.append(UnitFailure(unit.name, f"not run: {cause} failed", ""))
        ready = [u for u in waiting if set(u.deps) <= done]
        batch = ready[: max(backend.capacity - len(in_flight), 0)]
        if batch:
            for unit in batch:
                waiting.remove(unit)
                in_flight[unit.name] = ""
            backend.submit(batch)
        if not in_flight:
            break
        for finished in backend.wait(poll):
            name = finished.unit.name
            in_flight.pop(name, None)
            if finished.error is None:
                done.add(name)
                emit(UnitEvent("done", name, seconds=finished.seconds, work=finished.work))
            elif finished.retry and attempts.get(name, 0) < retries:
                attempts[name] = attempts.get(name, 0) + 1
                emit(UnitEvent("retry", name, detail=finished.error))
                waiting.insert(0, finished.unit)
            else:
                failed.add(name)
                emit(UnitEvent("failed", name, detail=finished.error))
                failures.append(UnitFailure(name, finished.error, finished.log))
        for name, shown in in_flight.items():
            worker = _worker(root, name)
            if worker and worker != shown:
                in_flight[name] = worker
                emit(UnitEvent("running", name, worker=worker))
    return failures


#: The longest error line kept whole; a longer one keeps its head and its tail (the advice).
ERROR_LINE_CHARS = 600


def error_line(error: BaseException | str) -> str:
    """One line for an error: its type and the first line of its message (a very long line
    keeps its beginning and its end, which says what to do, around an ellipsis)."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    if len(first) <= ERROR_LINE_CHARS:
        return first
    half = ERROR_LINE_CHARS // 2
    return f"{first[:half]} … {first[-half:]}"
