"""`SimWorker`: the Flusher's `Worker` (fsync and checkpoint thread) on virtual time.

Jobs run one at a time, in submission order, like `SyncThread`; each one takes
a seeded latency (`latency()` is drawn when the job starts) and runs at the
*end* of it, when its result is handed back. Running it late is the
adversarial choice for durability: a power cut while the "fsync" is in
flight loses everything it would have covered, so a caller that treated the
data as durable before the result came back is caught. Slow disks (an fsync
slower than a network round trip) are just larger latencies.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class SimWorker:
    """A `commitlog.flush.Worker` whose jobs take virtual time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, latency: Callable[[], float]) -> None:
        self._loop = loop
        self._latency = latency
        self._jobs: deque[tuple[Callable[[Any], Any], Any, asyncio.Future[Any]]] = deque()
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self.jobs_run = 0

    def submit(self, fn: Callable[[Any], T], arg: Any) -> asyncio.Future[T]:
        future: asyncio.Future[T] = self._loop.create_future()
        self._jobs.append((fn, arg, future))
        if not self._busy:
            self._start_next()
        return future

    def _start_next(self) -> None:
        if not self._jobs:
            self._busy = False
            return
        self._busy = True
        self._timer = self._loop.call_later(self._latency(), self._finish)

    def _finish(self) -> None:
        fn, arg, future = self._jobs.popleft()
        self._run(fn, arg, future)
        self._start_next()

    def _run(self, fn: Callable[[Any], Any], arg: Any, future: asyncio.Future[Any]) -> None:
        self.jobs_run += 1
        try:
            result = fn(arg)
        except Exception as exc:  # the waiter decides what it means, as with SyncThread
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(result)

    def shutdown(self) -> None:
        """Finish the submitted jobs now (SyncThread joins its thread)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._jobs:
            fn, arg, future = self._jobs.popleft()
            self._run(fn, arg, future)
        self._busy = False
