"""A micro sweep through a real Slurm (``--executor slurm``): the local table, a unit requeued by
``scontrol requeue`` while it runs, and ``--detach`` collected by ``--resume``.

Needs a running Slurm whose jobs see this filesystem, e.g. the localhost cluster of
``scripts/slurm_localhost.sh start``; skipped when there is none.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from tangentlens.cli import main


def _slurm_up() -> bool:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    try:
        states = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=10
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(s.rstrip("*") in ("idle", "mix", "alloc") for s in states)


pytestmark = pytest.mark.skipif(not _slurm_up(), reason="needs a running Slurm cluster")

SLURM = ["--executor", "slurm", "--set", "executor.time_min=20"]


def test_slurm_gives_the_local_table(units_reference, units_env, sweeps, tmp_path):
    out = tmp_path / "slurm"
    argv = ["sweep", "--recipe", sweeps.recipe, "--out", str(out), *SLURM, *sweeps.units]
    assert main(argv) == 0
    sweeps.assert_same_table(out, units_reference)
    assert json.loads((out / "jobs.json").read_text()).keys() >= {"data", "step-00000040"}


def test_a_unit_requeued_while_running_still_gives_the_local_table(
    units_reference, units_env, sweeps, tmp_path
):
    out = tmp_path / "requeued"
    process = sweeps.start(["--out", str(out), *SLURM, *sweeps.units], units_env)
    marker = out / "units" / "step-00000040.json"
    deadline = time.monotonic() + 600
    while True:
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline
        try:
            job = json.loads(marker.read_text())["job"]
            break
        except (OSError, ValueError, KeyError):
            time.sleep(0.05)
    subprocess.run(["scontrol", "requeue", job], check=True)
    assert process.wait(timeout=900) == 0, process.stderr.read()
    sweeps.assert_same_table(out, units_reference)
    # the requeued job ran the unit again (submitit ignores the SIGTERM of a requeue, so the
    # first run may still finish): its part is rewritten whole, the table is unchanged
    deadline = time.monotonic() + 300
    while (info := _job(job)).get("Restarts") != "1" or info["JobState"] != "COMPLETED":
        assert time.monotonic() < deadline, info
        time.sleep(1)
    sweeps.assert_same_table(out, units_reference)


def _job(job: str) -> dict[str, str]:
    text = subprocess.run(
        ["scontrol", "show", "job", job], capture_output=True, text=True, check=True
    ).stdout
    return dict(field.split("=", 1) for field in text.split() if "=" in field)


def test_detach_returns_at_once_and_resume_collects(units_reference, units_env, sweeps, tmp_path):
    out = tmp_path / "detached"
    argv = ["sweep", "--recipe", sweeps.recipe, "--out", str(out), *SLURM, *sweeps.units]
    started = time.monotonic()
    assert main([*argv, "--detach"]) == 0
    assert time.monotonic() - started < 60  # submitted, not run
    jobs = json.loads((out / "jobs.json").read_text())
    assert set(jobs) == {
        "data",
        "window-00000000",
        "window-00000010",
        "fit-proxies",
        "step-00000000",
        "step-00000040",
        "across-steps",
        "untrained-block",
    }
    assert not (out / ".lock").exists()  # nobody stays behind to coordinate
    assert main([*argv, "--resume"]) == 0  # waits for the live jobs, submits nothing twice
    assert json.loads((out / "jobs.json").read_text()) == jobs
    sweeps.assert_same_table(out, units_reference)
    assert json.loads((out / "manifest.json").read_text())["finished"]
