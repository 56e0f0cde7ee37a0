"""The same micro sweep on every executor gives exactly the local table: a real local Ray
cluster (worker processes), submitit's local executor, a worker killed mid-unit, and a run
started on one executor resumed on another."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tangentlens.cli import main


def _peak_running(run: Path, stop: threading.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], len(list((run / "units").glob("*.json"))))
        time.sleep(0.02)


@pytest.mark.parametrize("executor", ["ray", "submitit-local"])
def test_executor_gives_the_local_table(executor, units_reference, units_env, sweeps, tmp_path):
    out = tmp_path / executor
    stop, peak = threading.Event(), [0]
    watcher = threading.Thread(target=_peak_running, args=(out, stop, peak))
    watcher.start()
    try:
        argv = ["sweep", "--recipe", sweeps.recipe, "--out", str(out), "--executor", executor]
        argv += sweeps.units
        assert main([*argv, "--set", "executor.workers=2"]) == 0
    finally:
        stop.set()
        watcher.join()
    sweeps.assert_same_table(out, units_reference)
    assert 1 <= peak[0] <= 2  # at most `workers` units at once
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["executor"]["kind"] == executor and manifest["threads"] == 1
    assert not list((out / "units").glob("*.json"))  # no unit left marked running


@pytest.mark.parametrize("executor", ["ray", "submitit-local"])
def test_a_worker_killed_mid_unit_is_retried_and_the_table_is_identical(
    executor, units_reference, units_env, sweeps, tmp_path
):
    out = tmp_path / executor
    process = sweeps.start(["--out", str(out), "--executor", executor, *sweeps.units], units_env)
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
    sweeps.assert_same_table(out, units_reference)


def test_a_run_started_locally_resumes_on_another_executor(
    units_reference, units_env, sweeps, tmp_path
):
    out = tmp_path / "moved"
    process = sweeps.start(["--out", str(out), *sweeps.units], units_env)
    deadline = time.monotonic() + 300
    while not (out / "results" / "step-00000000.parquet").exists():
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)  # the coordinator dies; its lock stays
    process.wait()
    argv = ["sweep", "--recipe", sweeps.recipe, "--out", str(out), "--resume", *sweeps.units]
    assert main([*argv, "--executor", "submitit-local", "--set", "executor.workers=2"]) == 0
    sweeps.assert_same_table(out, units_reference)
