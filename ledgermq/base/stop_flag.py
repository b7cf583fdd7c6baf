"""A stop request that a signal handler may raise, and a sleep it ends.

A Python signal handler runs on the main thread between two bytecodes,
wherever that thread is, including inside a `threading.Event.wait()` that
holds its condition's lock for a few lines: a handler calling `Event.set()`
there waits for that lock forever, and the process never stops (the audit
scheduler hung so in a CI run). `StopFlag` takes no lock: `set` raises a
flag and writes a byte down a self-pipe, and `wait` selects on the pipe.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any


class StopFlag:
    """Set once (by a signal handler or by code); `wait(timeout)` sleeps
    until it is set or the time passes. Close it when done (`with`)."""

    def __init__(self) -> None:
        self.requested = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def set(self, _signum: int = 0, _frame: FrameType | None = None) -> None:
        """Request the stop; safe in a signal handler (usable as one)."""
        self.requested = True
        with contextlib.suppress(OSError):  # full (a byte is there) or closed
            os.write(self._write, b"x")

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds or until set; True when set."""
        if not self.requested:
            # A `set` after the check above left a byte in the pipe.
            readable, _, _ = select.select([self._read], [], [], max(0.0, timeout))
            if readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._read, 64)
        return self.requested

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> StopFlag:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def stop_on_signals(flag: StopFlag, signums: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
                    also: Any = None) -> Iterator[StopFlag]:
    """While inside, each of `signums` sets `flag` (then calls `also(signum)`,
    which must take no lock either); the previous handlers come back after."""
    def handler(signum: int, frame: FrameType | None) -> None:
        flag.set()
        if also is not None:
            also(signum)

    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield flag
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
