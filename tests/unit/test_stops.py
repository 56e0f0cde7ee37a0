"""Stop signals take Ctrl-C's path: inside :func:`stop_signals` SIGTERM, SIGHUP and SIGUSR1
raise :class:`Stopped` (a KeyboardInterrupt), once; a program's own handler stands; the
previous handlers come back after."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from tangentlens.sweep.stops import STOP_SIGNALS, Stopped, stop_signals


def _signal_main_thread(signum: int) -> None:
    """Send ``signum`` to this process's main thread and give its handler the next bytecode:
    ``os.kill`` may pick any thread of the process, and Python then runs the handler only
    when the main thread next looks (a sleep it is in is cut short)."""
    signal.pthread_kill(threading.main_thread().ident, signum)
    time.sleep(5)


@pytest.fixture
def default_handlers():
    """Every stop signal at its default action while the test runs, as in a plain shell (under
    ``nohup`` SIGHUP is ignored, and an ignored signal stays ignored: see below)."""
    before = {s: signal.signal(s, signal.SIG_DFL) for s in STOP_SIGNALS}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
def test_a_stop_signal_raises_stopped_and_the_handlers_come_back(signum, default_handlers):
    with pytest.raises(Stopped) as stopped, stop_signals():
        _signal_main_thread(signum)
    assert isinstance(stopped.value, KeyboardInterrupt)
    assert stopped.value.signal == signum and stopped.value.exit_code == 128 + signum
    assert str(stopped.value) == f"stopped by {signum.name}"
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == dict.fromkeys(
        STOP_SIGNALS, signal.SIG_DFL
    )


def test_an_ignored_signal_stays_ignored(default_handlers):
    """A sweep started under ``nohup`` (SIGHUP ignored) goes on when its terminal hangs up."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with stop_signals():
        signal.pthread_kill(threading.main_thread().ident, signal.SIGHUP)
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def test_a_second_signal_while_the_first_unwinds_is_ignored(default_handlers):
    with pytest.raises(Stopped), stop_signals():
        try:
            _signal_main_thread(signal.SIGTERM)
        finally:  # cleanup running when the next one arrives
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
            time.sleep(0.05)


def test_a_programs_own_handler_stands(default_handlers):
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        with stop_signals():
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
            time.sleep(0.05)
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)
