"""The signals a scheduler stops a sweep with take Ctrl-C's path.

Slurm sends ``SIGTERM`` when it pre-empts a job and at its time limit (then ``SIGKILL`` after
``KillWait``, 30 s by default); sites send ``SIGUSR1`` or ``SIGHUP`` (``--signal``, a closing
terminal). Python's default for each is to die at once, leaving the run directory's lock
behind, so that a requeued coordinator on another node is refused. Within
:func:`stop_signals` each raises :class:`Stopped`, a ``KeyboardInterrupt``: the sweep
unwinds as on Ctrl-C — the unit in progress is abandoned (its output is written atomically, so
nothing half-written stays), local worker jobs are cancelled, the lock is released — and
``--resume`` continues from any host. A handler the program installed itself is left in place;
signals arriving while the first unwinds are ignored.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["STOP_SIGNALS", "Stopped", "stop_signals"]

#: The signals that stop a sweep as Ctrl-C does (those this platform has).
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGUSR1") if hasattr(signal, name)
)


class Stopped(KeyboardInterrupt):
    """A sweep stopped by ``signal`` (a ``signal.Signals``)."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        super().__init__(f"stopped by {self.signal.name}")

    @property
    def exit_code(self) -> int:
        """The shell's code for a process ended by this signal (128 + its number)."""
        return 128 + int(self.signal)


class _Handler:
    """Raises :class:`Stopped` on the first stop signal, ignores the ones after it."""

    def __init__(self) -> None:
        self.fired = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.fired:
            return
        self.fired = True
        raise Stopped(signum)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Within the block, :data:`STOP_SIGNALS` raise :class:`Stopped` in the main thread (where
    they have Python's default action; a program's own handler, or this block's when nested,
    stands). Outside the main thread nothing changes: Python delivers signals there only. The
    previous handlers are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = _Handler()
    previous = {}
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_DFL:
            previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
