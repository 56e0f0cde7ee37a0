"""How the compute threads behave beside other work: the CPUs this process may use, and a
passive wait policy for the OpenMP runtime.

PyTorch's CPU kernels run on an OpenMP pool whose idle threads spin-wait for the next parallel
region by default. On a machine where another program holds a core, a spinning thread steals
the very core a working thread needs: a quickstart step went from ~13 s to ~400 s beside one
other CPU-bound process on 2 cores. With ``OMP_WAIT_POLICY=PASSIVE`` idle threads sleep
instead (about 20 s per step beside the same load). The policy is read once, when the OpenMP
runtime starts — at ``import torch`` — so it must be in the environment before that:
:func:`apply_runtime_defaults` sets it (unless the user set it) for the command line, and
:func:`runtime_env` carries it to every worker an executor starts (Ray, submitit, Slurm).

:func:`usable_cpus` counts the CPUs this process may actually run on — its affinity mask and a
cgroup CPU quota (a container, a Slurm allocation), not the machine's core count.

No torch import here: the command line calls this before anything heavy is loaded.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

__all__ = ["RUNTIME_DEFAULTS", "apply_runtime_defaults", "runtime_env", "usable_cpus"]

logger = logging.getLogger(__name__)

#: Environment defaults for the threading runtimes, applied unless the user set them.
RUNTIME_DEFAULTS: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}

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


def runtime_env() -> dict[str, str]:
    """The threading-runtime variables a worker needs before it imports torch: this process's
    value where set, else :data:`RUNTIME_DEFAULTS`."""
    return {name: os.environ.get(name, value) for name, value in RUNTIME_DEFAULTS.items()}


def apply_runtime_defaults() -> None:
    """Put :data:`RUNTIME_DEFAULTS` into this process's environment where the user has not set
    them. Effective only before torch is imported (logged otherwise: the runtime has started)."""
    missing = {k: v for k, v in RUNTIME_DEFAULTS.items() if k not in os.environ}
    if missing and "torch" in sys.modules:
        logger.info(
            "torch is already imported: %s applies to processes started from here only",
            ", ".join(f"{k}={v}" for k, v in missing.items()),
        )
    os.environ.update(missing)
