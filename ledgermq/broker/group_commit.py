"""Group commit: coalesce concurrent requests into one proposal.

Requests that arrive while `max_inflight` proposals are already running wait
in a queue; when a proposal finishes, everything queued (up to the batch
limits) becomes the next one. Under load each proposal carries many
requests, so the per-proposal cost (a Raft round, an fsync, a Python call
chain) is paid once per batch rather than once per message; with no load a
request goes out at once, alone.

A `GroupCommitter[T, R]` takes payloads of type T (`submit`) and hands each
batch, a list of `Pending[T, R]`, to its `flush` function, which resolves
every request's future with an R (the broker: `Records` -> `SendAck` for
sends, control operations -> the entry's index for controls). `flush`
returns an awaitable: a coroutine runs in a task of its own; a future (the
send path's, whose callbacks resolve the requests) is only watched, which
spares a task per proposal on the per-message path.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

T = TypeVar("T")  # what a request submits
R = TypeVar("R")  # what it gets back


@dataclass(eq=False, slots=True)
class Pending(Generic[T, R]):
    """One request waiting to be part of a proposal; `flush` resolves `future`."""

    payload: T
    size: int  # bytes, counted against max_bytes
    count: int  # messages, counted against max_count
    future: asyncio.Future[R] = field(repr=False)


Flush = Callable[[list[Pending[T, R]]], Awaitable[Any]]


class GroupCommitter(Generic[T, R]):
    def __init__(
        self,
        flush: Flush[T, R],
        *,
        max_count: int,
        max_bytes: int,
        max_inflight: int = 1,
    ) -> None:
        self._flush = flush
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.max_inflight = max_inflight
        self._queue: deque[Pending[T, R]] = deque()
        self._inflight: set[asyncio.Future[Any]] = set()
        self._starting = False
        self.batches = 0
        self.items = 0

    def submit(self, payload: T, size: int = 0, count: int = 1) -> asyncio.Future[R]:
        """Queue a request; the future resolves with what `flush` sets for it."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append(Pending(payload, size, count, future))
        self._kick()
        return future

    def _take(self) -> list[Pending[T, R]]:
        batch = [self._queue.popleft()]
        size, count = batch[0].size, batch[0].count
        while self._queue:
            nxt = self._queue[0]
            if size + nxt.size > self.max_bytes or count + nxt.count > self.max_count:
                break
            batch.append(self._queue.popleft())
            size += nxt.size
            count += nxt.count
        return batch

    def _kick(self) -> None:
        # The proposal takes its batch in a callback that runs after those
        # already queued in this loop iteration: requests decoded together
        # (or woken by the same reply) share one proposal instead of the
        # first going out alone.
        if self._queue and not self._starting and len(self._inflight) < self.max_inflight:
            self._starting = True
            asyncio.get_running_loop().call_soon(self._start)

    def _start(self) -> None:
        self._starting = False
        if not self._queue:
            return
        batch = self._take()
        self.batches += 1
        self.items += len(batch)
        try:
            flushing = asyncio.ensure_future(self._flush(batch))
        except Exception as exc:  # raised before anything was proposed
            _fail(batch, exc)
            self._kick()
            return
        self._inflight.add(flushing)
        flushing.add_done_callback(partial(self._flushed, batch))
        self._kick()  # what did not fit may start another proposal

    def _flushed(self, batch: list[Pending[T, R]], flushing: asyncio.Future[Any]) -> None:
        self._inflight.discard(flushing)
        if flushing.cancelled():
            _fail(batch, asyncio.CancelledError())
        else:
            error = flushing.exception()
            _fail(batch, error if error is not None
                  else RuntimeError("flush left a request unanswered"))
        self._kick()

    async def close(self) -> None:
        """Fail queued requests and wait for proposals in flight."""
        while self._queue:
            pending = self._queue.popleft()
            if not pending.future.done():
                pending.future.set_exception(ConnectionAbortedError("broker stopping"))
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=5.0)


def _fail(batch: list[Pending[T, R]], error: BaseException) -> None:
    """Every request of `batch` not answered yet gets `error`."""
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)
