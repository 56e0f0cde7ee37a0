"""Lock files that name their holder, at the edges of the stale-lock rule: a dead process of
this host or an unreadable lock is taken over, a live one or any of another host never; a
takeover marker older than TAKEOVER_STALE_S is a dead process's (mtimes set by ``os.utime`` and
the clock fixed, never by sleeping)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tangentlens import locking
from tangentlens.locking import (
    TAKEOVER_STALE_S,
    held_by_another,
    lock_holder,
    release,
    try_lock,
)

HOST = socket.gethostname()
#: A fixed "now" (whole seconds: an mtime set from it reads back exactly).
NOW = 1_800_000_000.0


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _write(lock, host: str = HOST, pid: int | str = 1) -> None:
    lock.write_text(json.dumps({"host": host, "pid": pid}))


def _names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_lock_names_its_holder_or_nobody(tmp_path):
    lock = tmp_path / ".lock"
    assert lock_holder(lock) is None  # gone
    _write(lock, "node-1", "12")
    assert lock_holder(lock) == {"host": "node-1", "pid": 12}
    for text in ("", "{", "[1, 2]", '{"host": "h"}', '{"host": "h", "pid": "x"}', "null"):
        lock.write_text(text)
        assert lock_holder(lock) is None, text


def test_who_may_still_be_running(monkeypatch):
    me, dead = os.getpid(), _dead_pid()
    assert held_by_another({"host": "node-7", "pid": dead})  # another host: never judged dead
    assert held_by_another({"host": "node-7", "pid": me})
    assert not held_by_another({"host": HOST, "pid": me})  # this process: not another
    assert not held_by_another({"host": HOST, "pid": dead})
    assert held_by_another({"host": HOST, "pid": os.getppid()})  # alive

    def denied(pid, signal):
        raise PermissionError  # another user's live process

    monkeypatch.setattr(os, "kill", denied)
    assert held_by_another({"host": HOST, "pid": dead})


def test_a_free_lock_is_taken_whole_and_leaves_no_temporary_file(tmp_path):
    lock = tmp_path / ".lock"
    assert try_lock(lock) == (None, False)
    assert lock_holder(lock) == {"host": HOST, "pid": os.getpid()}
    assert _names(tmp_path) == [".lock"]
    release(lock)
    release(lock)  # gone already: fine
    assert _names(tmp_path) == []


@pytest.mark.parametrize("text", ["dead", "unreadable"])
def test_a_dead_or_unreadable_lock_is_taken_over(tmp_path, text):
    lock = tmp_path / ".lock"
    if text == "dead":
        _write(lock, pid=_dead_pid())
    else:
        lock.write_text("{half-writ")
    assert try_lock(lock) == (None, True)
    assert lock_holder(lock) == {"host": HOST, "pid": os.getpid()}
    assert _names(tmp_path) == [".lock"]  # no marker, no temporary file


def test_a_live_or_remote_holder_keeps_its_lock(tmp_path):
    lock = tmp_path / ".lock"
    _write(lock, pid=os.getppid())
    assert try_lock(lock) == ({"host": HOST, "pid": os.getppid()}, False)
    _write(lock, "node-7", _dead_pid())
    holder, took_over = try_lock(lock)
    assert holder is not None and holder["host"] == "node-7" and not took_over
    assert _names(tmp_path) == [".lock"]
    assert lock_holder(lock)["host"] == "node-7"


@pytest.fixture
def fixed_clock(monkeypatch):
    monkeypatch.setattr(locking.time, "time", lambda: NOW)


def _marker(tmp_path, age: float):
    marker = tmp_path / ".lock.takeover"
    marker.write_text("")
    os.utime(marker, (NOW - age, NOW - age))
    return marker


@pytest.mark.parametrize(
    ("age", "cleared"),
    [
        (TAKEOVER_STALE_S - 0.5, False),
        (TAKEOVER_STALE_S, False),  # "older than": not yet
        (TAKEOVER_STALE_S + 0.5, True),
    ],
)
def test_a_takeover_marker_is_a_dead_processs_only_past_its_limit(
    tmp_path, fixed_clock, age, cleared
):
    assert TAKEOVER_STALE_S == 10.0
    lock = tmp_path / ".lock"
    _write(lock, pid=_dead_pid())
    marker = _marker(tmp_path, age)
    assert locking._take_over(lock, marker, lock_holder(lock)) is None  # another's, for now
    assert marker.exists() is not cleared
    assert lock.exists()  # never removed without the marker


def test_the_lock_is_removed_only_if_it_still_holds_the_dead_holder(tmp_path):
    lock, marker = tmp_path / ".lock", tmp_path / ".lock.takeover"
    dead = {"host": HOST, "pid": _dead_pid()}
    _write(lock, pid=dead["pid"])
    assert locking._take_over(lock, marker, {"host": HOST, "pid": dead["pid"] + 1}) is False
    assert lock.exists() and not marker.exists()  # the marker is let go either way
    assert locking._take_over(lock, marker, dead) is True
    assert not lock.exists() and not marker.exists()
    assert locking._take_over(lock, marker, None) is False  # gone meanwhile: nothing to remove
    lock.write_text("garbled")
    assert locking._take_over(lock, marker, dead) is False  # unreadable now, not the one seen
    assert locking._take_over(lock, marker, None) is True
    assert _names(tmp_path) == []


def test_a_marker_gone_under_the_takeover_is_no_error(tmp_path, monkeypatch):
    """Another process may remove the marker at any moment (it finished, or judged it stale):
    gone between the failed create and its age check, the takeover looks again (None); gone
    before this takeover lets it go, the takeover still counts."""
    lock = tmp_path / ".lock"
    dead = {"host": HOST, "pid": _dead_pid()}
    _write(lock, pid=dead["pid"])
    marker = _marker(tmp_path, 0.0)
    stat = type(marker).stat

    def vanished(path, *args, **kwargs):
        if path == marker:
            raise FileNotFoundError(path)
        return stat(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(type(marker), "stat", vanished)
        assert locking._take_over(lock, marker, dead) is None
    marker.unlink()
    holder = locking.lock_holder

    def removed_meanwhile(path):
        marker.unlink()  # another process clears the marker while this one holds it
        return holder(path)

    monkeypatch.setattr(locking, "lock_holder", removed_meanwhile)
    assert locking._take_over(lock, marker, dead) is True
    assert _names(tmp_path) == []


def test_a_takeover_under_way_is_waited_for(tmp_path, monkeypatch, fixed_clock):
    """Another process holds a fresh marker: try_lock looks again until it is gone (here, after
    two looks), then takes the dead lock over."""
    lock = tmp_path / ".lock"
    _write(lock, pid=_dead_pid())
    marker = _marker(tmp_path, 0.0)
    looks: list[float] = []

    def sleep(seconds: float) -> None:
        looks.append(seconds)
        if len(looks) == 2:
            marker.unlink()

    monkeypatch.setattr(locking.time, "sleep", sleep)
    assert try_lock(lock) == (None, True)
    assert looks == [0.005, 0.005]
    assert _names(tmp_path) == [".lock"]


def test_a_takeover_finished_by_another_gives_the_lock_to_it(tmp_path, monkeypatch, fixed_clock):
    lock = tmp_path / ".lock"
    _write(lock, pid=_dead_pid())
    marker = _marker(tmp_path, 0.0)

    def sleep(seconds: float) -> None:
        _write(lock, "node-2", 5)  # the other process took it over
        marker.unlink()

    monkeypatch.setattr(locking.time, "sleep", sleep)
    assert try_lock(lock) == ({"host": "node-2", "pid": 5}, False)
    assert _names(tmp_path) == [".lock"]


def test_a_takeover_that_never_ends_is_refused_past_the_wait(tmp_path, monkeypatch, fixed_clock):
    lock = tmp_path / ".lock"
    _write(lock, pid=_dead_pid())
    marker = _marker(tmp_path, 0.0)
    assert locking.TAKEOVER_WAIT_S == 30.0
    clock = iter([100.0, 100.0, 129.0, 130.0, 130.5])  # the deadline: 130.0

    monkeypatch.setattr(locking.time, "monotonic", lambda: next(clock))
    looks: list[float] = []
    monkeypatch.setattr(locking.time, "sleep", looks.append)
    with pytest.raises(ValueError) as error:
        try_lock(lock)
    assert len(looks) == 3  # at 100, 129 and exactly 130 it looks again; past 130 it gives up
    assert str(error.value) == (
        f"could not take the lock {lock}: another process has been taking it over for 30 s; "
        f"delete {marker} if nothing is starting there"
    )
    assert _names(tmp_path) == [".lock", ".lock.takeover"]  # no temporary file left


def test_a_takeover_counts_even_when_a_later_look_removed_nothing(tmp_path, monkeypatch):
    """A dead lock removed on one look, and another's lock gone by itself on the next (nothing
    removed then): the lock was still taken over from a dead holder."""
    lock = tmp_path / ".lock"
    _write(lock, pid=_dead_pid())
    outcomes = iter([True, False])

    def take_over(lock_, marker, seen):
        removed = next(outcomes)
        if not removed:
            lock_.unlink()  # gone by itself: not removed here
        return removed  # (the first leaves the lock: another dead one stands in its place)

    monkeypatch.setattr(locking, "_take_over", take_over)
    assert try_lock(lock) == (None, True)


def test_looking_at_a_process_sends_it_no_signal():
    """Liveness is asked with signal 0: the process looked at (here one that a hang-up would
    end) runs on."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert locking._pid_alive(child.pid)
        time.sleep(0.2)
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
