"""The same micro sweep on every executor gives exactly the local table: a real local Ray
cluster (worker processes), submitit's local executor, a worker killed mid-unit (one run per
executor, shared by the table and the kill: tests/e2e/conftest.py ``executor_runs``), and a run
stopped by SIGTERM mid-unit (a scheduler's pre-emption) resumed on another executor, as if on
another host."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tangentlens.cli import main


@pytest.mark.parametrize("executor", ["ray", "submitit-local"])
def test_executor_gives_the_local_table(executor, executor_runs, units_reference, sweeps):
    run = executor_runs(executor)
    sweeps.assert_same_table(run.out, units_reference, added=run.added)
    assert 1 <= run.peak <= 2  # at most `workers` units at once
    manifest = json.loads((run.out / "manifest.json").read_text())
    assert manifest["executor"]["kind"] == executor and manifest["threads"] == 1
    assert not list((run.out / "units").glob("*.json"))  # no unit left marked running


@pytest.mark.parametrize("executor", ["ray", "submitit-local"])
def test_a_worker_killed_mid_unit_is_retried_and_the_table_is_identical(
    executor, executor_runs, units_reference, sweeps
):
    run = executor_runs(executor)  # step-00000040's worker was killed while the unit ran
    assert run.killed != run.coordinator  # a worker, not the sweep: the sweep finished (rc 0)
    sweeps.assert_same_table(run.out, units_reference, added=run.added)


def _stopped_mid_unit(sweeps, args: list[str], env: dict[str, str], out) -> int:
    """Start the cut micro sweep with ``args``, send its coordinator SIGTERM while the unit
    ``step-00000040`` runs (as Slurm does at pre-emption or the time limit) and check how it
    stops: at once, one line that says so and how to go on, the lock released, the unit
    abandoned (no part, no marker, no failure log). Returns the pid that ran the unit."""
    process = sweeps.start(["--out", str(out), *sweeps.units, *args], env)
    marker = out / "units" / "step-00000040.json"
    deadline = time.monotonic() + 300
    while True:  # the unit's worker names itself while it runs
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline
        try:
            worker = json.loads(marker.read_text())["pid"]
            break
        except (OSError, ValueError):
            time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    lines = [line for line in process.stderr.read().splitlines() if line.strip()]
    assert len(lines) == 1 and "stopped by SIGTERM: " in lines[0], lines
    assert "continue with --resume" in lines[0] and "any host" in lines[0], lines
    assert not (out / ".lock").exists()  # another host may take the run
    assert not (out / "results" / "step-00000040.parquet").exists()  # stopped mid-unit
    assert not marker.exists() and not (out / "logs" / "step-00000040.log").exists()
    return worker


def _resume_elsewhere(sweeps, out, monkeypatch, *args: str) -> None:
    """``--resume`` the run in this process, as if on another host."""
    monkeypatch.setattr(socket, "gethostname", lambda: "node-2")
    argv = ["sweep", "--recipe", sweeps.recipe, "--out", str(out), "--resume", *sweeps.units]
    assert main([*argv, *args]) == 0


def test_a_local_sweep_stopped_by_sigterm_resumes_on_another_host_and_executor(
    units_reference, units_env, sweeps, tmp_path, monkeypatch
):
    out = tmp_path / "stopped"
    _stopped_mid_unit(sweeps, [], units_env, out)
    _resume_elsewhere(
        sweeps, out, monkeypatch, "--executor", "submitit-local", "--set", "executor.workers=2"
    )
    sweeps.assert_same_table(out, units_reference)


def test_a_submitit_sweep_stopped_by_sigterm_cancels_its_local_jobs_and_resumes(
    units_reference, units_env, sweeps, tmp_path, monkeypatch
):
    out = tmp_path / "stopped"
    args = ["--executor", "submitit-local", "--set", "executor.workers=2"]
    worker = _stopped_mid_unit(sweeps, args, units_env, out)
    deadline = time.monotonic() + 30  # the coordinator cancelled its jobs: none outlives it
    while _alive(worker):
        assert time.monotonic() < deadline, f"the unit's job (pid {worker}) outlived the sweep"
        time.sleep(0.05)
    _resume_elsewhere(sweeps, out, monkeypatch)
    sweeps.assert_same_table(out, units_reference)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie has ended
