"""A sweep beside other work (issues 22, 34): a one-step quickstart sweep — its fit window's
eight captures, the fit and step 1200 — timed quiet, beside ⌊CPUs/2⌋ pure-Python busy loops and
beside another PyTorch process multiplying matrices, each sweep in a fresh process so that the
OpenMP wait policy is read at its ``import torch``.

Rows (median of ``repeats`` runs each; ``--quick``: one run), all against the quiet run with the
runtime's default spin-then-sleep (``OMP_WAIT_POLICY`` unset, what tangentlens runs with):

* quiet, ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep at once): what the policy costs when
  nothing else runs (goal ≤ 1.05);
* beside the busy loops, the default (goal ≤ 2.5);
* beside the busy loops, ``PASSIVE`` (goal ≤ 2.5);
* beside a PyTorch job (1024² float32 products in a loop) on ⌊CPUs/2⌋ threads, the default
  (goal ≤ 3: a notebook or a second unit beside a sweep);
* beside the same job on its default threads (every CPU: the machine oversubscribed; no goal).

A run under load is stopped after ``_LOADED_LIMIT_S`` (then the limit is reported, a lower
bound).

Needs the mini-pythia suite in the cache (``make run`` trains it).
"""

from __future__ import annotations

import contextlib
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

#: A run under load is stopped after this many seconds.
_LOADED_LIMIT_S = 600
_SWEEP = ["sweep", "--recipe", "quickstart", "--set", "suite.steps='1200'"]


def _sweep_seconds(policy: str | None, limit: float | None = None) -> float:
    """Wall time of one fresh one-step quickstart sweep with ``OMP_WAIT_POLICY=policy`` (None:
    unset; the limit when it was stopped there)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "tangentlens.cli", *_SWEEP, "--out", f"{tmp}/run"]
        start = time.perf_counter()
        try:
            subprocess.run(command, env=env, check=True, capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return float(limit)  # type: ignore[arg-type]
        return time.perf_counter() - start


@contextmanager
def _neighbours(
    code: str, n: int, settle: float, env: dict[str, str] | None = None
) -> Iterator[None]:
    """``n`` other Python processes running ``code`` while the block runs (after ``settle``
    seconds), killed after it."""
    processes = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(n)]
    try:
        time.sleep(settle)
        yield
    finally:
        for process in processes:
            process.kill()
            process.wait()


def busy_loops(n: int) -> contextlib.AbstractContextManager[None]:
    """``n`` pure-Python busy loops in other processes while the block runs."""
    return _neighbours("while True: pass", n, settle=1.0)  # let them take their cores


def torch_job(n_threads: int | None) -> contextlib.AbstractContextManager[None]:
    """Another PyTorch process multiplying 1024 × 1024 float32 matrices in a loop on
    ``n_threads`` threads (None: torch's default, every CPU) while the block runs."""
    pin = "" if n_threads is None else f"torch.set_num_threads({n_threads}); "
    code = f"import torch; {pin}a = torch.randn(1024, 1024)\nwhile True: a @ a"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return _neighbours(code, 1, settle=5.0, env=env)  # its import and first products


def _median(policy: str | None, repeats: int, limit: float | None = None) -> float:
    return statistics.median(_sweep_seconds(policy, limit) for _ in range(repeats))


def run(quick: bool) -> list[dict[str, Any]]:
    repeats = 1 if quick else 3
    n_loops = max(usable_cpus() // 2, 1)
    shape = f"quickstart, step 1200 + fit window, {repeats} run(s) each"
    quiet = _median(None, repeats)
    quiet_passive = _median("PASSIVE", repeats)
    with busy_loops(n_loops):
        loaded = _median(None, repeats, _LOADED_LIMIT_S)
        loaded_passive = _median("PASSIVE", repeats, _LOADED_LIMIT_S)
    with torch_job(n_loops):
        beside_torch = _median(None, repeats, _LOADED_LIMIT_S)
    with torch_job(None):
        beside_torch_all = _median(None, repeats, _LOADED_LIMIT_S)
    beside = f"beside {n_loops} busy loop(s)"
    job = "beside a PyTorch job on {} thread(s)"
    reference = "quiet, default wait policy"
    return [
        ratio_row("sweep, quiet, PASSIVE", shape, reference, quiet_passive, quiet, "≤ 1.05"),
        ratio_row(f"sweep {beside}, default", shape, reference, loaded, quiet, "≤ 2.5"),
        ratio_row(f"sweep {beside}, PASSIVE", shape, reference, loaded_passive, quiet, "≤ 2.5"),
        ratio_row(f"sweep {job.format(n_loops)}", shape, reference, beside_torch, quiet, "≤ 3"),
        ratio_row(
            f"sweep {job.format(usable_cpus())}", shape, reference, beside_torch_all, quiet, "—"
        ),
    ]
