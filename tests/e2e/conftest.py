"""What the end-to-end sweep tests share: a cache holding the trained micro suite, the micro
recipe cut to a few units of every kind, its local run (the reference table), its run on each
executor with a worker killed mid-unit, and how to compare tables and start a sweep process."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tangentlens.sweep.store import read_results

_KEY = ("step", "site", "probe", "method", "rank", "freq_bin", "metric")


@dataclass(frozen=True)
class Sweeps:
    """``recipe``: the micro recipe; ``units``: overrides giving every kind of unit, few of each
    (data, 2 window captures, fit, 2 steps, across-steps, the untrained block: 8 units, 5 parts),
    one thread per unit (2 workers on 2 cores)."""

    recipe: str = str(Path(__file__).parent / "recipes" / "micro.toml")
    units: tuple[str, ...] = (
        "--set",
        "suite.steps='0,40'",
        "--set",
        "proxies.window_checkpoints=2",
        "--set",
        "capture.threads=1",
    )

    def start(self, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        """``tangentlens sweep --recipe <micro> ARGS`` in a child process."""
        return subprocess.Popen(
            [sys.executable, "-m", "tangentlens.cli", "sweep", "--recipe", self.recipe, *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    @staticmethod
    def assert_same_table(
        run: Path, reference: Path, parts: int = 5, added: tuple[str, ...] = ()
    ) -> None:
        """Same rows, same values (NaN equal to NaN), ``parts`` parts (one per unit with rows),
        no temporary file; ``added``: probes ``run`` has beside the reference's (their rows,
        and only theirs, are left out)."""
        rows = read_results(run).to_pylist()
        got = {tuple(r[k] for k in _KEY): r for r in rows if r["probe"] not in added}
        want = {tuple(r[k] for k in _KEY): r for r in read_results(reference).to_pylist()}
        assert len({tuple(r[k] for k in _KEY) for r in rows}) == len(rows)
        assert {r["probe"] for r in rows} - {r["probe"] for r in got.values()} == set(added)
        assert got.keys() == want.keys()
        for key, row in want.items():
            assert all(_same(row[f], got[key][f]) for f in row), key
        assert len(list((run / "results").glob("*.parquet"))) == parts
        assert not list((run / "results").glob(".*"))


def _same(a, b) -> bool:
    return a == b or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


@pytest.fixture(scope="session")
def sweeps() -> Sweeps:
    return Sweeps()


@pytest.fixture(scope="session")
def units_cache(tmp_path_factory):
    """A cache holding the trained micro suite."""
    from tangentlens.models.suites import ensure_mini_suite

    root = tmp_path_factory.mktemp("units-cache")
    ensure_mini_suite("micro-pythia", cache_dir=root / "suites")
    return root


@pytest.fixture
def units_env(units_cache, monkeypatch):
    monkeypatch.setenv("TANGENTLENS_CACHE", str(units_cache))
    return {**os.environ, "TANGENTLENS_CACHE": str(units_cache)}


@pytest.fixture(scope="session")
def units_reference(sweeps, units_cache, tmp_path_factory):
    """The local executor's run of the cut micro recipe: the table every executor must give."""
    out = tmp_path_factory.mktemp("local") / "run"
    env = {**os.environ, "TANGENTLENS_CACHE": str(units_cache)}
    process = sweeps.start(["--out", str(out), *sweeps.units], env)
    assert process.wait(timeout=600) == 0, process.stderr.read()
    return out


#: The probe the Ray run adds: the README's own probe package (tests/fixtures/gradnorm_probe),
#: whose rows tests/e2e/test_user_probes.py reads from that run.
USER_PROBE = "grad_norm"


@dataclass(frozen=True)
class ExecutorRun:
    """The cut micro sweep (:attr:`Sweeps.units`, 2 workers) on one executor with the worker of
    ``step-00000040`` killed mid-unit: its run directory, the most units seen running at once,
    the killed worker's pid, the coordinator's pid and the probes it adds to the reference's."""

    out: Path
    peak: int
    killed: int
    coordinator: int
    added: tuple[str, ...]


def _watch_running(run: Path, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], len(list((run / "units").glob("*.json"))))
        time.sleep(0.02)


def _killed_run(sweeps: Sweeps, kind: str, out: Path, env: dict[str, str]) -> ExecutorRun:
    added = (USER_PROBE,) if kind == "ray" else ()
    args = ["--out", str(out), "--executor", kind, *sweeps.units, "--set", "executor.workers=2"]
    args += [arg for probe in added for arg in ("--set", f"probes.{probe}={{}}")]
    stop, peak = threading.Event(), [0]
    watcher = threading.Thread(target=_watch_running, args=(out, stop, peak))
    watcher.start()
    try:
        process = sweeps.start(args, env)
        deadline = time.monotonic() + 300
        marker = out / "units" / "step-00000040.json"
        while True:  # the unit's worker names itself while it runs
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline
            try:
                pid = json.loads(marker.read_text())["pid"]
                break
            except (OSError, ValueError):
                time.sleep(0.02)
        if pid != process.pid:  # a worker, never the coordinator: asserted by the tests
            os.kill(pid, signal.SIGKILL)
        assert process.wait(timeout=600) == 0, process.stderr.read()
    finally:
        stop.set()
        watcher.join()
    return ExecutorRun(out, peak[0], pid, process.pid, added)


@pytest.fixture(scope="session")
def executor_runs(sweeps, units_cache, tmp_path_factory):
    """``executor_runs(kind)``: the :class:`ExecutorRun` of ``kind`` ("ray": with the README's
    user probe added; "submitit-local"), run once per session and shared by the executor tests
    (the table, the killed worker) and the user-probe test (its rows on Ray workers)."""
    made: dict[str, ExecutorRun] = {}
    env = {**os.environ, "TANGENTLENS_CACHE": str(units_cache)}

    def run(kind: str) -> ExecutorRun:
        if kind not in made:
            made[kind] = _killed_run(sweeps, kind, tmp_path_factory.mktemp(kind) / "run", env)
        return made[kind]

    return run
