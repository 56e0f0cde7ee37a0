"""Recovery advice that works: a failed sweep either keeps its run directory and logs (and
``--resume`` completes it) or says plainly that nothing was kept (and the same command starts
again); an error a retry cannot change is not retried; a directory a sweep killed in its first
seconds left behind is started again."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

from tangentlens.cli import main
from tangentlens.sweep import units
from tangentlens.sweep.store import read_results

#: Four units (data, two steps, across-steps) of one cheap probe.
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
