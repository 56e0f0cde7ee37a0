"""How the compute threads behave beside other work: the CPUs this process may use, and the
threading-runtime settings every worker inherits.

PyTorch's CPU kernels run on an OpenMP pool whose idle threads spin-wait for the next parallel
region. Beside another CPU-bound program the spinning steals the core a working thread needs: a
one-step quickstart sweep took 49 s quiet and 126 s beside one pure-Python busy loop on 2 cores,
most of it in loops of small products (now on one thread, :func:`single_thread`: 55 s quiet and 111
s beside the loop), and 397 s beside another PyTorch process multiplying matrices on one thread
(7.6× its 52 s quiet, 2026-11-27). ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep) removes most
of that — 71 s beside the PyTorch job, 67–77 s beside the loop — but costs 12–38 % when the
machine is quiet (every parallel region pays a wake-up), and shorter spins (``GOMP_SPINCOUNT``)
do not help under load. So a sweep chooses at its start, before torch is imported
(:func:`passive_when_busy`): when other programs keep at least :data:`BUSY_CPUS` of its CPUs
busy (:func:`busy_cpus`, a quarter-second look at ``/proc/stat``) its idle threads sleep, else
they spin; a setting of the user's (:data:`RUNTIME_VARS`) always stands, and
:func:`runtime_env` carries the choice to every worker an executor starts (Ray, submitit, Slurm).
The wait policy changes no number. A neighbour that starts after the sweep is not seen (set
``OMP_WAIT_POLICY=PASSIVE`` yourself then). ``python -m benchmarks load`` measures both policies,
quiet and loaded, on the machine at hand.

:func:`usable_cpus` counts the CPUs this process may actually run on — its affinity mask and a
cgroup CPU quota (a container, a Slurm allocation), not the machine's core count.

:func:`single_thread` runs a block on one thread — torch's pool and numpy's BLAS pools (found
with ``threadpoolctl``), which :func:`threads` pins together: iterative fits of small matrices
(semi-NMF's coordinate sweeps) issue thousands of parallel regions too small to gain from a
second thread, each of which spins on a busy core (one step's semi-NMF refits took 4.4 s quiet
and 22.8 s beside one busy loop on two threads; 0.28 s against 1.06 s for one fit on one
thread). Their results do not depend on the thread count then.

:func:`alongside` runs one task on a thread of its own while the caller goes on with the
others (a step's semi-NMF refits, read by one probe only, beside the other probes): the task's
numbers are the same as run in line, since it runs on one thread either way.

:class:`Phases` times the parts of a unit (a step's capture, each probe, its refit, its write)
on the device's clock, for the unit's timing record.

:func:`exact_float32` runs a block with TensorFloat-32 (and oneDNN's reduced float32) off for
every matmul, convolution and RNN, whatever the user chose (``torch.backends.cuda.matmul.
allow_tf32 = True`` and ``torch.set_float32_matmul_precision("high")`` are common in training
notebooks), and restores the user's settings after: every unit of a sweep and ``measure`` run
inside it, so their float32 paths (TwoNN's float32 candidate bound, curvature's exact
neighbours, semi-NMF's float32 products, the model's own forward and backward) keep float32's
24-bit mantissa (TF32 keeps 10) and the table does not depend on those settings.

:func:`half_precision_slowdown` times a matmul at a half-precision dtype against float32: on a
CPU without native bfloat16/float16 kernels (AVX2 only: AMD EPYC, 2026-11-26, torch 2.13) a
512³ ``mm`` ran 60× slower at either dtype (0.47 against 87 GFLOP/s at 2048 × 512 × 2048).

No torch import at module level.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "BUSY_CPUS",
    "RUNTIME_VARS",
    "Phases",
    "alongside",
    "busy_cpus",
    "exact_float32",
    "half_precision_slowdown",
    "passive_when_busy",
    "runtime_env",
    "single_thread",
    "threads",
    "usable_cpus",
]

#: The threading runtimes' own settings (wait policy, spin and block times): a worker reads them
#: when it imports torch, so they travel with every unit where the user set them.
RUNTIME_VARS: tuple[str, ...] = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")

#: Other programs' load (busy CPUs, :func:`busy_cpus`) from which a sweep's idle threads sleep.
BUSY_CPUS = 0.5

_PROC_STAT = Path("/proc/stat")
_CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1 = (
    Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
    Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"),
)


def _cgroup_quota(v2: Path = _CGROUP_V2, v1: tuple[Path, Path] = _CGROUP_V1) -> float | None:
    """CPUs granted by a cgroup quota (quota / period), None when there is none or it cannot be
    read."""
    try:
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if v1[0].exists() and v1[1].exists():
            quota_us, period_us = int(v1[0].read_text()), int(v1[1].read_text())
            return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None
    return None


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask (``os.sched_getaffinity``, else the
    machine's count), capped by a cgroup CPU quota rounded up; at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cpus = min(cpus, max(math.ceil(quota), 1))
    return max(cpus, 1)


def _cpu_jiffies(cpus: set[int], stat: Path) -> tuple[int, int] | None:
    """(busy, total) jiffies since boot summed over the lines of ``cpus`` in ``stat``
    (``/proc/stat``: busy is all but idle and iowait); None when it cannot be read."""
    busy = total = 0
    try:
        for line in stat.read_text().splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                ticks = [int(f) for f in fields[:8]]
                total += sum(ticks)
                busy += sum(ticks) - ticks[3] - ticks[4]
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total) if total else None


def busy_cpus(window: float = 0.25, stat: Path = _PROC_STAT) -> float | None:
    """How many of this process's CPUs (its affinity mask) other programs kept busy over the
    next ``window`` seconds, while this process sleeps; None where ``/proc/stat`` cannot be read
    (not Linux)."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not on Linux
        return None
    before = _cpu_jiffies(cpus, stat)
    time.sleep(window)
    after = _cpu_jiffies(cpus, stat)
    if before is None or after is None or after[1] <= before[1]:
        return None
    return len(cpus) * (after[0] - before[0]) / (after[1] - before[1])


def passive_when_busy(threshold: float = BUSY_CPUS) -> str | None:
    """Before torch is imported: set ``OMP_WAIT_POLICY=PASSIVE`` for this process (and, through
    :func:`runtime_env`, every worker it starts) when other programs keep at least
    ``threshold`` of its CPUs busy (:func:`busy_cpus`), and say so in one line (returned; None
    when nothing was set). Left alone when the user chose a runtime setting
    (:data:`RUNTIME_VARS`), or torch is already imported (its threads have read theirs). The
    wait policy changes no number: only how idle threads wait."""
    if any(name in os.environ for name in RUNTIME_VARS) or "torch" in sys.modules:
        return None
    busy = busy_cpus()
    if busy is None or busy < threshold:
        return None
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return (
        f"other programs keep {busy:.1f} of this process's {usable_cpus()} CPUs busy: idle "
        "compute threads sleep (OMP_WAIT_POLICY=PASSIVE) rather than spin on a core they need; "
        "set OMP_WAIT_POLICY yourself to choose"
    )


def runtime_env() -> dict[str, str]:
    """The :data:`RUNTIME_VARS` set in this process (a worker inherits the user's choice)."""
    return {name: os.environ[name] for name in RUNTIME_VARS if name in os.environ}


@functools.cache
def _blas_pools() -> Any:
    """numpy's BLAS thread pools (a ``threadpoolctl`` controller, found once: numpy is loaded
    with torch)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


@contextlib.contextmanager
def threads(count: int) -> Iterator[None]:
    """Within the block, torch's CPU kernels and numpy's BLAS run on ``count`` threads (a unit's
    ``capture.threads``); the caller's counts are restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        with _blas_pools().limit(limits=count):
            yield
    finally:
        torch.set_num_threads(before)


def single_thread() -> contextlib.AbstractContextManager[None]:
    """Within the block (or the decorated function), torch's CPU kernels and numpy's BLAS run
    on one thread; the counts are restored after."""
    return threads(1)


@contextlib.contextmanager
def alongside(task: Callable[[], T]) -> Iterator[Callable[[], T]]:
    """Within the block, ``task`` runs on one thread of its own and the block on the caller's
    other threads (torch's count less one); yields a function that waits for the task's result
    (or raises its exception). The block's exit waits for the task. numpy's BLAS pools, which
    are process-wide, stay on one thread throughout, so nested pins in either thread restore
    the same count. With one thread to the caller the task runs in line, when its result is
    first asked for (once)."""
    import torch

    budget = torch.get_num_threads()
    if budget < 2:
        yield functools.cache(task)
        return

    def on_one_thread() -> T:
        with threads(1):
            return task()

    with (
        threads(budget - 1),
        _blas_pools().limit(limits=1),
        ThreadPoolExecutor(1, thread_name_prefix="tangentlens-alongside") as pool,
    ):
        yield pool.submit(on_one_thread).result


def _precision_settings() -> list[Any]:
    """The objects holding ``fp32_precision`` (torch ≥ 2.9's API), parents first: the generic
    one, then cuBLAS matmul, cuDNN (convolutions, RNNs) and oneDNN (matmul, convolutions, RNNs);
    empty on an older torch."""
    import torch

    b = torch.backends
    if not hasattr(b.cuda.matmul, "fp32_precision"):
        return []
    holders = [b, b.cuda.matmul, b.cudnn, b.cudnn.conv, b.cudnn.rnn]
    holders += [b.mkldnn, b.mkldnn.matmul, b.mkldnn.conv, b.mkldnn.rnn]
    return [h for h in holders if hasattr(h, "fp32_precision")]


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """Within the block, float32 matmuls, convolutions and RNNs compute in full float32 (no
    TF32, no reduced-precision oneDNN kernels) whatever the user's settings; the settings are
    restored after, as they were (through the same API: ``fp32_precision`` where torch has it,
    else ``allow_tf32`` and ``set_float32_matmul_precision``)."""
    import torch

    holders = _precision_settings()
    if holders:
        saved = [h.fp32_precision for h in holders]
        for holder in holders[1:]:
            holder.fp32_precision = "ieee"
        try:
            yield
        finally:
            for holder, value in zip(holders, saved, strict=True):
                holder.fp32_precision = value
        return
    legacy = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = legacy[:2]
        torch.set_float32_matmul_precision(legacy[2])


class Phases:
    """Where a unit's time goes: seconds per named phase, each measured from the end of the
    work queued before it to the end of its own (an accelerator's queue is waited for at both
    ends, so a phase is charged for its kernels, not for the ones before). ``seconds`` keeps
    the phases in the order first met; a phase timed twice adds up. A phase timed on another
    thread (:func:`alongside`'s task) overlaps the others."""

    def __init__(self, device: Any = None) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}

    def _wait(self) -> None:
        import torch

        if self.device is not None and torch.device(self.device).type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name``."""
        self._wait()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._wait()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def half_precision_slowdown(dtype: str, size: int = 512) -> float:
    """How many times slower a ``size``³ ``mm`` runs at ``dtype`` (``"bfloat16"``,
    ``"float16"``) than at float32 on this process's CPU threads (each timed once, after a
    warm-up)."""
    import torch

    seconds = {}
    for name in ("float32", dtype):
        a = torch.ones(size, size, dtype=getattr(torch, name))
        torch.mm(a, a)
        start = time.perf_counter()
        torch.mm(a, a)
        seconds[name] = time.perf_counter() - start
    return seconds[dtype] / max(seconds["float32"], 1e-9)
