"""A sweep beside other work (issue 22): a one-step quickstart sweep — its fit window's eight
captures, the fit and step 1200 — timed quiet and beside ⌊CPUs/2⌋ pure-Python busy loops, each
in a fresh process so that the OpenMP wait policy is read at its ``import torch``.

Rows (median of ``repeats`` runs each; ``--quick``: one run):

* quiet, the passive wait policy the command line sets (ours) against the runtime's default
  active spinning (reference): what the policy costs when nothing else runs (goal ≤ 1.05);
* beside the busy loops against quiet, passive (goal ≤ 2.5);
* beside the busy loops against quiet, active spinning (the collapse the policy removes; one
  run, stopped after ``_ACTIVE_LIMIT_S``: a stopped run reports that limit, a lower bound).

Needs the mini-pythia suite in the cache (``make run`` trains it).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks._timing import ratio_row
from tangentlens.runtime import usable_cpus

#: A run under load with active spinning is stopped after this many seconds.
_ACTIVE_LIMIT_S = 600
_SWEEP = ["sweep", "--recipe", "quickstart", "--set", "suite.steps='1200'"]


def _sweep_seconds(policy: str, limit: float | None = None) -> float:
    """Wall time of one fresh one-step quickstart sweep with ``OMP_WAIT_POLICY=policy`` (the
    limit when it was stopped there)."""
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "tangentlens.cli", *_SWEEP, "--out", f"{tmp}/run"]
        start = time.perf_counter()
        try:
            subprocess.run(command, env=env, check=True, capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return float(limit)  # type: ignore[arg-type]
        return time.perf_counter() - start


@contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """``n`` pure-Python busy loops in other processes while the block runs."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(1.0)  # let them take their cores
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def _median(policy: str, repeats: int) -> float:
    return statistics.median(_sweep_seconds(policy) for _ in range(repeats))


def run(quick: bool) -> list[dict[str, Any]]:
    repeats = 1 if quick else 3
    n_loops = max(usable_cpus() // 2, 1)
    shape = f"quickstart, step 1200 + fit window, {repeats} run(s) each"
    quiet_passive = _median("PASSIVE", repeats)
    quiet_active = _median("ACTIVE", repeats)
    with busy_loops(n_loops):
        loaded_passive = _median("PASSIVE", repeats)
        loaded_active = _sweep_seconds("ACTIVE", limit=_ACTIVE_LIMIT_S)
    loaded = f"beside {n_loops} busy loop(s)"
    return [
        ratio_row(
            "sweep, quiet: passive / active wait policy",
            shape,
            "active (the runtime's default)",
            quiet_passive,
            quiet_active,
            "≤ 1.05",
        ),
        ratio_row(
            f"sweep {loaded}, passive policy",
            shape,
            "quiet",
            loaded_passive,
            quiet_passive,
            "≤ 2.5",
        ),
        ratio_row(
            f"sweep {loaded}, active policy (1 run, capped {_ACTIVE_LIMIT_S} s)",
            shape,
            "quiet",
            loaded_active,
            quiet_active,
            "the collapse the policy removes",
        ),
    ]
