"""The thread that runs a Flusher's fsyncs and hands each result back to the loop.

Lighter than `ThreadPoolExecutor` + `run_in_executor`: one queue put starts a
job and one `call_soon_threadsafe` finishes it, with no pair of chained
futures (each with its own lock and callbacks) in between. With many
concurrent appenders the event loop is the bottleneck and pays for every
hand-off, so this is measured, not cosmetic (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[Callable[[Any], Any], Any, "asyncio.Future[Any]", asyncio.AbstractEventLoop]


class SyncThread:
    """Runs submitted calls one at a time, in order, on one thread."""

    def __init__(self, name: str = "fsync") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        # Started by the first job, so an owner that never runs one (a node
        # that failed before starting) leaves no thread behind.
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[Any], T], arg: Any) -> asyncio.Future[T]:
        """Run `fn(arg)` on the thread; the future (of the running loop) gets
        its result or the exception it raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put((fn, arg, future, loop))
        return future

    def shutdown(self) -> None:
        """Finish the jobs already submitted, then stop the thread."""
        if self._thread is None:
            return
        self._jobs.put(None)
        self._thread.join()
        self._thread = None

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, arg, future, loop = job
            try:
                result = fn(arg)
            except Exception as exc:  # the waiter on the loop decides what it means
                finish: tuple[Callable[..., None], Any] = (_fail, exc)
            else:
                finish = (_succeed, result)
            # A closed loop has nobody left to tell.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(finish[0], future, finish[1])


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
