"""Recovery advice that works: a failed sweep either keeps its run directory and logs (and
``--resume`` completes it) or says plainly that nothing was kept (and the same command starts
again); an error a retry cannot change (a full disk among them) is not retried; a directory a
sweep killed in its first seconds left behind is started again; a sweep stopped by SIGTERM
mid-unit (a scheduler's pre-emption or time limit), on the local and the submitit executors,
says so in one line, releases its lock and resumes from another host on another executor to
the uninterrupted table."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tangentlens.cli import main
from tangentlens.sweep import units
from tangentlens.sweep.store import read_results
from tests.e2e.conftest import Sweeps

#: Four units (data, two steps, across-steps) of one cheap probe, and a fixture probe that holds
#: the step it is told to (tangentlens_scopes:HOLD) so that a stop lands mid-unit.
RECIPE = """\
[suite]
name = "micro-pythia"
steps = "0,40"

[data]
corpus = "analysis"
seq_len = 32
max_tokens = 1024
n_bins = 2

[capture]
sites = ["resid_post"]
reservoir = 256

[probes.cosine_drift]
[probes."tangentlens_scopes:HOLD"]
"""


def _recipe(tmp_path: Path) -> str:
    path = tmp_path / "recovery.toml"
    path.write_text(RECIPE)
    return str(path)


def _failing(kind: str, error: BaseException, monkeypatch) -> list[str]:
    """Make every unit of ``kind`` raise ``error``; returns the names of the units it failed."""
    calls: list[str] = []

    def fail(recipe, store, unit, status):
        calls.append(unit.name)
        raise error

    monkeypatch.setitem(units._RUNNERS, kind, fail)
    return calls


def _log_of(error: str) -> Path:
    return Path(re.search(r"\(log: ([^)]+)\)", error).group(1))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_failure_before_any_unit_finished_keeps_nothing_but_says_so(
    units_env, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "run"
    argv = ["sweep", "--recipe", _recipe(tmp_path), "--out", str(out)]
    original = units._RUNNERS["data"]
    calls = _failing("data", ValueError("data.corpus: no such corpus"), monkeypatch)
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert calls == ["data"]  # a configuration error is not retried (executor.retries = 1)
    assert "data: ValueError: data.corpus: no such corpus" in error
    assert "no checkpoint had been measured, so nothing was kept" in error
    assert "run the same command again" in error
    assert "--resume" not in error and not out.exists()
    log = _log_of(error)  # set aside: it outlives the run directory
    text = log.read_text()
    assert text.startswith(units.NOT_RETRIED) and "no such corpus" in text
    monkeypatch.setitem(units._RUNNERS, "data", original)
    # a sweep killed after it took the lock, before its manifest: only its lock is left
    out.mkdir()
    holder = {"host": socket.gethostname(), "pid": _dead_pid()}
    (out / ".lock").write_text(json.dumps(holder))
    assert main([*argv, "--resume"]) == 0  # nothing to resume: it starts
    assert {r["step"] for r in read_results(out).to_pylist()} == {0, 40}


def test_a_failure_after_a_checkpoint_was_measured_keeps_the_run_and_resume_completes_it(
    units_env, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "run"
    argv = ["sweep", "--recipe", _recipe(tmp_path), "--out", str(out)]
    original = units._RUNNERS["step"]
    calls: list[str] = []

    def fail_at_40(recipe, store, unit, status):
        calls.append(unit.name)
        if unit.step == 40:
            raise OSError("disk full")
        original(recipe, store, unit, status)

    monkeypatch.setitem(units._RUNNERS, "step", fail_at_40)
    assert main(argv) == 2
    error = capsys.readouterr().err
    # an error that may pass is retried once (executor.retries = 1)
    assert calls == ["step-00000000", "step-00000040", "step-00000040"]
    assert f"{out} is kept" in error and "pass --resume" in error
    assert "step-00000040: OSError: disk full" in error
    log = _log_of(error)
    assert log.parent == out / "logs" and "disk full" in log.read_text()
    assert not log.read_text().startswith(units.NOT_RETRIED)
    assert (out / "results" / "step-00000000.parquet").exists()  # what finished is kept
    monkeypatch.setitem(units._RUNNERS, "step", original)
    assert main([*argv, "--resume"]) == 0
    assert {r["step"] for r in read_results(out).to_pylist()} == {0, 40}


def test_a_full_disk_is_not_retried_and_says_where(units_env, tmp_path, capsys, monkeypatch):
    """A unit stopped by a full disk (ENOSPC) is not retried (another try cannot free space) and
    the error says that the disk is full, where, and how much is free; it names no log (there is
    no room to write one)."""
    import errno

    out = tmp_path / "run"
    argv = ["sweep", "--recipe", _recipe(tmp_path), "--out", str(out)]
    original = units._RUNNERS["step"]
    calls: list[str] = []

    def full_at_40(recipe, store, unit, status):
        calls.append(unit.name)
        if unit.step == 40:
            where = store.root / "results" / ".step-00000040.parquet.x1"
            raise OSError(errno.ENOSPC, "No space left on device", str(where))
        original(recipe, store, unit, status)

    monkeypatch.setitem(units._RUNNERS, "step", full_at_40)
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert calls == ["step-00000000", "step-00000040"]  # not retried
    assert "step-00000040: DiskFullError: the disk is full: no space left writing " in error
    assert "writing results/.step-00000040.parquet.x1 (" in error  # named from the run directory
    assert f"on the filesystem of {out}); free some space there" in error
    assert "(log:" not in error and not (out / "logs" / "step-00000040.log").exists()
    monkeypatch.setitem(units._RUNNERS, "step", original)
    assert main([*argv, "--resume"]) == 0


def test_an_out_naming_a_file_is_refused_in_one_line_before_planning(tmp_path, capsys):
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    for out in (existing, existing / "run"):
        argv = ["sweep", "--recipe", _recipe(tmp_path), "--out", str(out)]
        assert main(argv) == 2
        (line,) = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
        assert "not a folder: choose another --out" in line and "Errno" not in line
    assert existing.read_text() == "mine"


@pytest.fixture(scope="module")
def uninterrupted(units_cache, tmp_path_factory):
    """The recipe's run, uninterrupted: the table a stopped and resumed run must give."""
    root = tmp_path_factory.mktemp("uninterrupted")
    out = root / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TANGENTLENS_CACHE", str(units_cache))
        assert main(["sweep", "--recipe", _recipe(root), "--out", str(out)]) == 0
    return out


def _stopped_mid_unit(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[Path, int]:
    """Start the recipe's sweep in a child process, send its coordinator SIGTERM while the unit
    ``step-00000040`` runs (as Slurm does at pre-emption or the time limit) and check how it
    stops: at once, one line that says so and how to go on, the lock released, the unit
    abandoned (no part, no marker, no failure log). Returns the run directory and the pid that
    ran the unit."""
    out = tmp_path / "stopped"
    argv = ["sweep", "--recipe", _recipe(tmp_path), "--out", str(out), *args]
    from tangentlens_scopes import HOLD_STEP

    process = subprocess.Popen(
        [sys.executable, "-m", "tangentlens.cli", *argv],
        env={**env, HOLD_STEP: "40"},  # the unit waits until it is stopped
        # started as from a script's background job (`… &`, nohup): SIGINT ignored, inherited
        # by every process the sweep starts
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    marker = out / "units" / "step-00000040.json"
    deadline = time.monotonic() + 300
    while True:  # the unit's worker names itself while it runs
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline
        try:
            worker = json.loads(marker.read_text())["pid"]
            break
        except (OSError, ValueError):
            time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM
    lines = [line for line in process.stderr.read().splitlines() if line.strip()]
    assert len(lines) == 1 and "stopped by SIGTERM: " in lines[0], lines
    assert "continue with --resume" in lines[0] and "any host" in lines[0], lines
    assert not (out / ".lock").exists()  # another host may take the run
    assert not (out / "results" / "step-00000040.parquet").exists()  # stopped mid-unit
    assert not marker.exists() and not (out / "logs" / "step-00000040.log").exists()
    return out, worker


def _resume_elsewhere(tmp_path: Path, out: Path, monkeypatch, *args: str) -> None:
    """``--resume`` the run in this process, as if on another host."""
    monkeypatch.setattr(socket, "gethostname", lambda: "node-2")
    argv = ["sweep", "--recipe", _recipe(tmp_path), "--out", str(out), "--resume", *args]
    assert main(argv) == 0


def _same_table(run: Path, reference: Path) -> None:
    parts = len(list((reference / "results").glob("*.parquet")))
    Sweeps.assert_same_table(run, reference, parts=parts)


def test_a_local_sweep_stopped_by_sigterm_resumes_on_another_host_and_executor(
    uninterrupted, units_env, tmp_path, monkeypatch
):
    out, _ = _stopped_mid_unit(tmp_path, units_env)
    _resume_elsewhere(tmp_path, out, monkeypatch, "--executor", "submitit-local")
    _same_table(out, uninterrupted)


def test_a_submitit_sweep_stopped_by_sigterm_cancels_its_local_jobs_and_resumes(
    uninterrupted, units_env, tmp_path, monkeypatch
):
    out, worker = _stopped_mid_unit(tmp_path, units_env, "--executor", "submitit-local")
    deadline = time.monotonic() + 30  # the coordinator cancelled its jobs: none outlives it
    while _alive(worker):
        assert time.monotonic() < deadline, f"the unit's job (pid {worker}) outlived the sweep"
        time.sleep(0.05)
    _resume_elsewhere(tmp_path, out, monkeypatch)
    _same_table(out, uninterrupted)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie has ended
