"""The run directory's lifecycle: a directory a coordinator left before writing its manifest
(killed in its first seconds) is an unstarted run, started again with or without --resume; a
live or remote lock is never taken; a failed start leaves nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tangentlens.sweep.store import RunStore


def _dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _left_by_a_killed_sweep(root, pid: int, host: str | None = None) -> None:
    """What `kill -9` leaves after the lock is taken and before the manifest is written: the
    lock and the temporary file it was linked from."""
    root.mkdir()
    holder = json.dumps({"host": host or socket.gethostname(), "pid": pid})
    (root / ".lock").write_text(holder)
    (root / ".lock.k2j4x8").write_text(holder)


@pytest.mark.parametrize("resume", [False, True])
def test_a_dead_coordinators_lock_without_a_manifest_is_an_unstarted_run(tmp_path, resume):
    root = tmp_path / "run"
    _left_by_a_killed_sweep(root, _dead_pid())
    with RunStore.open(root, resume=resume) as store:
        assert not store.resuming  # nothing to resume: a fresh run
        assert json.loads((root / ".lock").read_text())["pid"] == os.getpid()
        assert sorted(p.name for p in root.iterdir()) == [".lock"]
        store.write_manifest({"recipe": {}})
    assert sorted(p.name for p in root.iterdir()) == ["manifest.json"]


def test_a_live_or_remote_lock_is_never_taken_even_without_a_manifest(tmp_path):
    live = tmp_path / "live"
    _left_by_a_killed_sweep(live, os.getppid())  # a live process on this host
    for resume in (False, True):
        with (
            pytest.raises(ValueError, match=r"locked by a running sweep \(pid \d+\)"),
            RunStore.open(live, resume=resume),
        ):
            pass
    remote = tmp_path / "remote"
    _left_by_a_killed_sweep(remote, 1, host="node-7")
    with (
        pytest.raises(ValueError, match=r"locked by a sweep on host node-7 \(pid 1\)"),
        RunStore.open(remote, resume=False),
    ):
        pass
    assert (live / ".lock").exists() and (remote / ".lock").exists()


def test_a_run_with_a_manifest_or_other_files_is_not_taken_for_an_unstarted_one(tmp_path):
    started = tmp_path / "started"
    _left_by_a_killed_sweep(started, _dead_pid())
    (started / "manifest.json").write_text("{}")
    with (
        pytest.raises(ValueError, match="already holds a run; pass --resume"),
        RunStore.open(started, resume=False),
    ):
        pass
    with RunStore.open(started, resume=True) as store:
        assert store.resuming
    other = tmp_path / "other"
    _left_by_a_killed_sweep(other, _dead_pid())
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="already holds a run"), RunStore.open(other, resume=False):
        pass
    assert (other / "notes.txt").exists()
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match="holds no run"), RunStore.open(missing, resume=True):
        pass


def test_a_failed_start_leaves_nothing_and_a_failed_resume_keeps_the_run(tmp_path):
    root = tmp_path / "run"
    with pytest.raises(RuntimeError), RunStore.open(root, resume=False) as store:
        store.write_manifest({})
        raise RuntimeError("before any unit finished")
    assert not root.exists()
    with RunStore.open(root, resume=False) as store:
        store.write_manifest({})
    with pytest.raises(RuntimeError), RunStore.open(root, resume=True):
        raise RuntimeError("while resuming")
    assert (root / "manifest.json").exists()
