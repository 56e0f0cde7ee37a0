"""Lock files that name their holder, taken in one atomic step: a run directory's coordinator
(:mod:`tangentlens.sweep.store`) and the training of a mini suite
(:func:`tangentlens.models.suites.ensure_mini_suite`) hold one.

A lock is created exclusively and whole — ``{"host", "pid"}`` written under a temporary name and
hard-linked into place (a link fails when the lock exists, and nobody reads a half-written
lock) — so of processes started together exactly one gets it. An existing lock is judged where
it stands: a live process of this host, or any process on another host (whose liveness cannot
be checked from here), holds it; a dead process of this host, or an unreadable lock, held it,
and it is taken over under an exclusive marker (``<lock>.takeover``: the holder is read again
under the marker and removed only if it is still the one judged dead), so two processes taking
over the same dead lock cannot both win. No fcntl lock: clusters' shared filesystems (Lustre
without ``flock``) refuse them, while exclusive creation and links work everywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["Holder", "held_by_another", "lock_holder", "release", "try_lock"]

#: ``{"host": str, "pid": int}``: who holds a lock.
Holder = dict[str, Any]

#: A takeover marker older than this (seconds) was left by a process that died while it took
#: over a dead lock (a takeover takes milliseconds): it is removed.
TAKEOVER_STALE_S = 10.0
#: How long :func:`try_lock` waits for another process's takeover of a dead lock.
TAKEOVER_WAIT_S = 30.0


def lock_holder(lock: Path) -> Holder | None:
    """``{"host", "pid"}`` from a lock file, or None when it is unreadable or gone."""
    try:
        holder = json.loads(lock.read_text())
        return {"host": str(holder["host"]), "pid": int(holder["pid"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def held_by_another(holder: Holder) -> bool:
    """Whether ``holder`` may still be running: a process on another host (whose liveness cannot
    be checked from here), or a live process of this host other than this one."""
    if holder["host"] != socket.gethostname():
        return True
    return holder["pid"] != os.getpid() and _pid_alive(holder["pid"])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def try_lock(lock: Path) -> tuple[Holder | None, bool]:
    """Take ``lock`` if nobody else holds it: ``(None, took_over)`` once taken (``took_over``:
    a dead holder's lock was taken over), ``(holder, False)`` when :func:`held_by_another`
    ``holder`` holds it. The lock's folder must exist."""
    marker = lock.with_name(f"{lock.name}.takeover")
    deadline = time.monotonic() + TAKEOVER_WAIT_S
    took_over, tmp = False, None
    try:
        while True:
            if tmp is None or not os.path.exists(tmp):  # (a holder clearing a folder removes it)
                tmp = _holder_file(lock.parent, lock.name)
            try:
                os.link(tmp, lock)
                return None, took_over
            except (FileExistsError, FileNotFoundError):
                pass
            holder = lock_holder(lock)
            if holder is not None and held_by_another(holder):
                return holder, False
            removed = _take_over(lock, marker, holder)
            if removed is None:  # another process is taking it over: look again
                if time.monotonic() > deadline:
                    raise ValueError(
                        f"could not take the lock {lock}: another process has been taking it "
                        f"over for {TAKEOVER_WAIT_S:.0f} s; delete {marker} if nothing is "
                        "starting there"
                    )
                time.sleep(0.005)
            took_over = took_over or bool(removed)
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def release(lock: Path) -> None:
    """Remove ``lock`` (held by this process); gone already is fine."""
    with contextlib.suppress(FileNotFoundError):
        lock.unlink()


def _holder_file(folder: Path, name: str) -> str:
    """A temporary file in ``folder`` holding this process's ``{"host", "pid"}``."""
    fd, tmp = tempfile.mkstemp(prefix=f"{name}.", dir=folder)
    with os.fdopen(fd, "w") as handle:
        json.dump({"host": socket.gethostname(), "pid": os.getpid()}, handle)
    return tmp


def _take_over(lock: Path, marker: Path, seen: Holder | None) -> bool | None:
    """Under the exclusive ``marker``, remove ``lock`` if it still holds the dead holder
    ``seen`` (None: unreadable); whether it was removed, or None when another process holds the
    marker. A marker older than :data:`TAKEOVER_STALE_S` is a dead process's: it is removed."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            if time.time() - marker.stat().st_mtime > TAKEOVER_STALE_S:
                marker.unlink()
        return None
    try:
        if lock.exists() and lock_holder(lock) == seen:  # still the dead (or unreadable) one
            lock.unlink()
            return True
        return False
    finally:
        marker.unlink(missing_ok=True)
