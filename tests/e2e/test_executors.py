"""The same micro sweep on every executor gives exactly the local table: a real local Ray
cluster (worker processes), submitit's local executor, a worker killed mid-unit, and a run
started on one executor resumed on another."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tangentlens.cli import main
from tangentlens.sweep.store import read_results

MICRO = str(Path(__file__).parent / "recipes" / "micro.toml")
KEY = ("step", "site", "probe", "method", "rank", "freq_bin", "metric")
# every kind of unit, few of each: data, 2 window captures, fit, 2 steps, across-steps and the
# untrained block (8 units)
UNITS = ["--set", "suite.steps='0,40'", "--set", "probes.tangent_energy.window_checkpoints=2"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    from tangentlens.models.suites import ensure_mini_suite

    root = tmp_path_factory.mktemp("cache")
    ensure_mini_suite("micro-pythia", cache_dir=root / "suites")
    return root


@pytest.fixture
def env(cache, monkeypatch):
    monkeypatch.setenv("TANGENTLENS_CACHE", str(cache))
    return {**os.environ, "TANGENTLENS_CACHE": str(cache)}


@pytest.fixture(scope="module")
def local_run(cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "run"
    env = {**os.environ, "TANGENTLENS_CACHE": str(cache)}
    process = _sweep(["--out", str(out), *UNITS], env)
    assert process.wait(timeout=600) == 0, process.stderr.read()
    return out


def _sweep(args, env):
    return subprocess.Popen(
        [sys.executable, "-m", "tangentlens.cli", "sweep", "--recipe", MICRO, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _same(a, b):
    return a == b or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


def _assert_same_table(run, reference):
    got = {tuple(r[k] for k in KEY): r for r in read_results(run).to_pylist()}
    want = {tuple(r[k] for k in KEY): r for r in read_results(reference).to_pylist()}
    assert len(got) == len(read_results(run)) and got.keys() == want.keys()
    for key, row in want.items():
        assert all(_same(row[f], got[key][f]) for f in row), key
    assert len(list((Path(run) / "results").glob("*.parquet"))) == 5  # one per unit with rows
    assert not list((Path(run) / "results").glob(".*"))  # no temporary part left


def _peak_running(run: Path, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], len(list((run / "units").glob("*.json"))))
        time.sleep(0.02)


@pytest.mark.parametrize("executor", ["ray", "submitit-local"])
def test_executor_gives_the_local_table(executor, local_run, env, tmp_path):
    out = tmp_path / executor
    stop, peak = threading.Event(), [0]
    watcher = threading.Thread(target=_peak_running, args=(out, stop, peak))
    watcher.start()
    try:
        argv = ["sweep", "--recipe", MICRO, "--out", str(out), "--executor", executor, *UNITS]
        assert main([*argv, "--set", "executor.workers=2"]) == 0
    finally:
        stop.set()
        watcher.join()
    _assert_same_table(out, local_run)
    assert 1 <= peak[0] <= 2  # at most `workers` units at once
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["executor"]["kind"] == executor and manifest["threads"] == 2
    assert not list((out / "units").glob("*.json"))  # no unit left marked running


@pytest.mark.parametrize("executor", ["ray", "submitit-local"])
def test_a_worker_killed_mid_unit_is_retried_and_the_table_is_identical(
    executor, local_run, env, tmp_path
):
    out = tmp_path / executor
    process = _sweep(["--out", str(out), "--executor", executor, *UNITS], env)
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
    assert pid != process.pid
    os.kill(pid, signal.SIGKILL)
    assert process.wait(timeout=600) == 0, process.stderr.read()
    _assert_same_table(out, local_run)


def test_a_run_started_locally_resumes_on_another_executor(local_run, env, tmp_path):
    out = tmp_path / "moved"
    process = _sweep(["--out", str(out), *UNITS], env)
    deadline = time.monotonic() + 300
    while not (out / "results" / "step-00000000.parquet").exists():
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)  # the coordinator dies; its lock stays
    process.wait()
    argv = ["sweep", "--recipe", MICRO, "--out", str(out), "--resume", *UNITS]
    assert main([*argv, "--executor", "submitit-local", "--set", "executor.workers=2"]) == 0
    _assert_same_table(out, local_run)
