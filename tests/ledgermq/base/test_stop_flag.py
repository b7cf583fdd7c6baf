"""StopFlag (ledgermq/base/stop_flag.py): a stop request a signal handler may
raise without taking a lock, and the sleep it ends. The service loops use
it (`ledgermq audit schedule`, `ledgermq dev`); the audit scheduler's test
sends SIGTERM after every line of its loop."""

from __future__ import annotations

import os
import signal
import threading
import time

from ledgermq.base.stop_flag import StopFlag, stop_on_signals


def test_wait_sleeps_the_timeout_when_nothing_stops_it() -> None:
    with StopFlag() as flag:
        started = time.monotonic()
        assert flag.wait(0.05) is False
        assert time.monotonic() - started >= 0.05
        assert flag.requested is False


def test_a_stop_set_before_or_during_the_wait_ends_it() -> None:
    with StopFlag() as flag:
        flag.set()
        assert flag.wait(30) is True  # at once: a 30 s sleep would time the test out
        assert flag.wait(30) is True  # and stays set
    with StopFlag() as flag:
        threading.Timer(0.05, flag.set).start()
        assert flag.wait(30) is True


def test_a_real_signal_ends_the_wait_and_the_old_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGUSR1)
    seen: list[int] = []
    with StopFlag() as flag, stop_on_signals(flag, [signal.SIGUSR1], also=seen.append):
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        assert flag.wait(30) is True
        assert seen == [signal.SIGUSR1]
    assert signal.getsignal(signal.SIGUSR1) == before


def test_many_sets_never_block_the_setter() -> None:
    """The pipe holds a byte or more; a full pipe is fine (set never blocks)."""
    with StopFlag() as flag:
        for _ in range(100_000):
            flag.set()
        assert flag.wait(0) is True
    flag.set()  # closed: still no error (a late signal after the service ended)
