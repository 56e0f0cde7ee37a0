"""The ``slurm`` and ``submitit-local`` executors: units as submitit jobs.

``slurm`` submits through submitit's ``AutoExecutor`` to Slurm: the units that become ready
together go as one job array (``executor.array_parallelism`` at a time), with the recipe's
partition, time limit, CPUs, GPUs (units that load a model only), memory and extra ``sbatch``
options, ``--requeue``, and a job that Slurm pre-empts or times out is requeued by submitit
(the unit restarts; its output is written atomically, so a rerun leaves one part). A failed job
is resubmitted up to ``executor.retries`` times.

With ``--detach`` the whole graph of missing units is submitted at once, each kind of unit as an
array that starts after the arrays it reads (``afterok``; dependents of a failed unit are
cancelled by Slurm), the job ids are written to ``jobs.json`` in the run directory, and the
command returns. A later ``--resume`` waits for those jobs still queued or running instead of
submitting them again, resubmits what failed, and completes the run.

``submitit-local`` runs the same jobs as local processes (what tests use on a machine without
Slurm); submitit starts every job at once, so at most ``executor.workers`` (default: as many
as the machine's cores hold at ``capture.threads`` each) are submitted at a time.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import submitit
from submitit.helpers import Checkpointable

from tangentlens.core.recipe import Recipe
from tangentlens.core.resolve import RunPlan
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
from tangentlens.sweep.store import disk_full
from tangentlens.sweep.units import UnitReport, read_failure, run_unit, unit_log

__all__ = ["JOBS_FILE", "UnitJob", "run_on_submitit"]

#: Unit → Slurm job id of the units a detached sweep submitted (in the run directory).
JOBS_FILE = "jobs.json"

#: Slurm states of a job that is still coming or running (it is waited for, not resubmitted).
_LIVE_STATES = frozenset(
    {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING"}
)


class UnitJob(Checkpointable):
    """The callable a job runs: one unit. Checkpointable: when Slurm pre-empts the job or its
    time runs out, submitit requeues the same call (the unit starts again from its inputs)."""

    def __call__(self, run: RunPlan, root: str, unit: Unit) -> UnitReport:
        _interruptible()
        return run_unit(run, root, unit)


def _interruptible() -> None:
    """Let SIGINT interrupt this job's unit: a stopped coordinator of this machine cancels a unit
    that way (:meth:`SubmititBackend.cancel_local`), and a job started from a background shell
    (``tangentlens sweep … &`` in a script, ``nohup``) inherits SIGINT ignored."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _job_folder(recipe: Recipe, root: Path) -> Path:
    """Where submitit keeps each job's pickles and logs (``%j``: the job id)."""
    folder = recipe.executor.folder
    return (Path(folder) if folder else root / "logs" / "submitit") / "%j"


def _executor(recipe: Recipe, root: Path) -> submitit.AutoExecutor:
    spec = recipe.executor
    cluster = "slurm" if spec.kind == "slurm" else "local"
    executor = submitit.AutoExecutor(folder=_job_folder(recipe, root), cluster=cluster)
    params: dict[str, Any] = {
        "name": f"tangentlens-{recipe.name}",
        "timeout_min": spec.time_min,
        "cpus_per_task": unit_cpus(recipe),
    }
    if cluster == "slurm":
        env = worker_env(recipe.capture.threads)
        params["slurm_setup"] = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
        params["slurm_array_parallelism"] = spec.array_parallelism or 256
        if spec.partition:
            params["slurm_partition"] = spec.partition
        if spec.memory_gb:
            params["mem_gb"] = spec.memory_gb
    executor.update_parameters(**params)
    return executor


@contextlib.contextmanager
def _local_env(executor: submitit.AutoExecutor, recipe: Recipe) -> Iterator[None]:
    """For ``submitit-local``: the units' environment (:func:`worker_env`) set in this process
    while its jobs start (a local job copies it). Not through submitit's ``local_setup``: that
    starts each job under ``sh -c``, and cancelling a job then signals the shell, not the job
    — a stopped sweep would leave its units running."""
    if executor.cluster == "slurm":
        yield
        return
    env = worker_env(recipe.capture.threads)
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _additional(recipe: Recipe, dependency: Sequence[str] = ()) -> dict[str, Any]:
    extra: dict[str, Any] = {"requeue": True, **recipe.executor.sbatch}
    if dependency:
        extra["dependency"] = "afterok:" + ":".join(dependency)
        extra["kill_on_invalid_dep"] = "yes"
    return extra


def _submit(
    executor: submitit.AutoExecutor,
    run: RunPlan,
    root: Path,
    units: Sequence[Unit],
    dependency: Sequence[str] = (),
) -> list[Any]:
    """Submit ``units`` as arrays (those that load a model with the GPUs), each job given the
    resolved recipe ``run``; returns their jobs in the order of ``units``."""
    recipe = run.recipe
    jobs: dict[str, Any] = {}
    for model in (True, False):
        group = [u for u in units if u.model == model]
        if not group:
            continue
        gpus = math.ceil(recipe.executor.gpus_per_unit) if model else 0
        if executor.cluster == "slurm":
            executor.update_parameters(
                gpus_per_node=gpus, slurm_additional_parameters=_additional(recipe, dependency)
            )
        else:
            executor.update_parameters(gpus_per_node=gpus)
        with _local_env(executor, recipe), executor.batch():  # jobs start as the batch ends
            submitted = [executor.submit(UnitJob(), run, str(root), u) for u in group]
        jobs.update({u.name: job for u, job in zip(group, submitted, strict=True)})
    return [jobs[u.name] for u in units]


def _record(root: Path, jobs: dict[str, str]) -> None:
    path = root / JOBS_FILE
    known = json.loads(path.read_text()) if path.exists() else {}
    tmp = path.with_name(f".{JOBS_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({**known, **jobs}, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _slurm_states() -> dict[str, str]:
    """The state of every job (array task) of this user that Slurm still knows: queued, running,
    requeued, or finished within MinJobAge. ``squeue``, not submitit's ``sacct``: clusters
    without accounting have no sacct, and submitit then never sees a killed job end."""
    out = subprocess.run(
        ["squeue", "--noheader", "--array", "--states=all", "--me", "--format=%i|%T"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("|", 1) for line in out.split() if "|" in line)


def _live(job_id: str, states: dict[str, str]) -> bool:
    return states.get(job_id, "GONE").split()[0] in _LIVE_STATES


class SubmititBackend:
    """Submits ready units as submitit jobs and polls them: a job is finished when its result
    file exists or, on Slurm, when it is no longer queued or running."""

    def __init__(self, executor: submitit.AutoExecutor, run: RunPlan, root: Path) -> None:
        self.executor, self.run, self.root = executor, run, root
        self.slurm = executor.cluster == "slurm"
        self.capacity = 1 << 30 if self.slurm else concurrent_units(run.recipe)
        # seconds between looks: a local job's end is a file and a process (cheap to check); on
        # Slurm each look is an squeue call, and a job takes ~1 s to start anyway
        self.poll = 1.0 if self.slurm else 0.05
        self.jobs: dict[str, tuple[Unit, Any, float]] = {}

    def adopt(self, unit: Unit, job: Any) -> None:
        self.jobs[unit.name] = (unit, job, time.perf_counter())

    def submit(self, units: Sequence[Unit]) -> None:
        jobs = _submit(self.executor, self.run, self.root, units)
        if self.slurm:
            _record(self.root, {u.name: j.job_id for u, j in zip(units, jobs, strict=True)})
        for unit, job in zip(units, jobs, strict=True):
            self.adopt(unit, job)

    def cancel_local(self, grace: float = 10.0) -> None:
        """Cancel the local jobs in flight (``submitit-local``: processes of this machine that
        would outlive a stopped coordinator) and wait up to ``grace`` seconds for them to end.
        Slurm's jobs run on: ``jobs.json`` names them and a resumed coordinator waits for
        them instead of submitting them again."""
        if self.slurm:
            return
        jobs = [job for _, job, _ in self.jobs.values()]
        for unit, job, _ in self.jobs.values():
            # the unit's own process (its marker names it) is interrupted: its job then ends
            # cleanly; a job whose unit has not started yet is cancelled through submitit
            pid = _running_pid(self.root, unit.name)
            if pid is None:
                job.cancel(check=False)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + grace
        while any(not job.done() for job in jobs) and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait(self, timeout: float) -> list[Finished]:
        deadline = time.monotonic() + timeout
        while True:
            states = _slurm_states() if self.slurm else {}
            out = [
                self._finished(unit, job, started, states.get(job.job_id))
                for unit, job, started in self.jobs.values()
                if self._ended(job, states)
            ]
            if out or time.monotonic() >= deadline:
                break
            time.sleep(min(self.poll, timeout))
        for finished in out:
            del self.jobs[finished.unit.name]
        return out

    def _ended(self, job: Any, states: dict[str, str]) -> bool:
        if job.paths.result_pickle.exists():
            return True
        return not _live(job.job_id, states) if self.slurm else job.done()

    def _finished(self, unit: Unit, job: Any, started: float, state: str | None) -> Finished:
        seconds = time.perf_counter() - started
        if not job.paths.result_pickle.exists():  # killed, cancelled, or its node failed
            why = state or "no longer in the queue"
            error = f"the job ended without a result ({why})"
            return Finished(unit, error, str(job.paths.stderr), seconds)
        try:  # one read of the result file: the unit's report, or its failure
            report = job.result()
        except submitit.core.utils.FailedJobError as error:
            # the unit wrote its traceback (last line: the error) before the job failed
            log = unit_log(self.root, unit.name)
            failure = read_failure(log)
            if failure is None and disk_full(error):  # no room for the unit's own log
                line = f"the disk is full (no space left on the filesystem of {self.root})"
                return Finished(unit, line, "", seconds, retry=False)
            if failure is None:
                return Finished(unit, error_line(error), str(job.paths.stderr), seconds)
            line, retry = failure
            return Finished(unit, error_line(line), str(log), seconds, retry=retry)
        return Finished(unit, seconds=seconds, work=report.seconds)


def _running_pid(root: Path, unit: str) -> int | None:
    """The pid of the process of this host running ``unit`` (from its marker), or None."""
    try:
        marker = json.loads((root / "units" / f"{unit}.json").read_text())
    except (OSError, ValueError):
        return None
    return int(marker["pid"]) if marker.get("host") == socket.gethostname() else None


def _live_jobs(
    recipe: Recipe, root: Path, executor: submitit.AutoExecutor, plan: Plan
) -> dict[str, Any]:
    """The detached jobs (``jobs.json``) of missing units that Slurm still queues or runs."""
    path = root / JOBS_FILE
    if executor.cluster != "slurm" or not path.exists():
        return {}
    ids = json.loads(path.read_text())
    missing = {u.name for u in plan.pending(root)}
    states = _slurm_states()
    return {
        name: submitit.SlurmJob(folder=_job_folder(recipe, root), job_id=job_id)
        for name, job_id in ids.items()
        if name in missing and _live(job_id, states)
    }


def _submit_graph(
    executor: submitit.AutoExecutor, run: RunPlan, plan: Plan, root: Path, live: dict[str, Any]
) -> None:
    """Submit every missing unit at once, each level of the graph after the jobs it reads."""
    ids = {name: job.job_id for name, job in live.items()}
    waiting = [u for u in plan.pending(root) if u.name not in live]
    while waiting:
        level = [u for u in waiting if not any(d in {w.name for w in waiting} for d in u.deps)]
        dependency = sorted({ids[d] for u in level for d in u.deps if d in ids})
        jobs = _submit(executor, run, root, level, dependency)
        ids.update({u.name: j.job_id for u, j in zip(level, jobs, strict=True)})
        waiting = [u for u in waiting if u not in level]
    _record(root, ids)


def run_on_submitit(
    run: RunPlan,
    plan: Plan,
    root: str | Path,
    emit: Callable[[UnitEvent], None],
    *,
    detach: bool = False,
) -> list[UnitFailure]:
    """Run (or, with ``detach``, submit) the missing units of ``plan`` as submitit jobs, each
    given the resolved recipe ``run``."""
    recipe = run.recipe
    root = Path(root).resolve()
    executor = _executor(recipe, root)
    live = _live_jobs(recipe, root, executor, plan)
    if detach:
        _submit_graph(executor, run, plan, root, live)
        return []
    backend = SubmititBackend(executor, run, root)
    for name, job in live.items():
        backend.adopt(plan[name], job)
    running = [plan[name] for name in live]
    try:
        return schedule(
            plan, root, backend, retries=recipe.executor.retries, emit=emit, running=running
        )
    except KeyboardInterrupt:  # Ctrl-C or a stop signal: no local job outlives the sweep
        backend.cancel_local()
        raise
