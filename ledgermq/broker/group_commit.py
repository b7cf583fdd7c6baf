"""Group commit: coalesce concurrent requests into one proposal.

Requests that arrive while `max_inflight` proposals are already running wait
in a queue; when a proposal finishes, everything queued (up to the batch
limits) becomes the next one. Under load each proposal carries many
requests, so the per-proposal cost (a Raft round, an fsync, a Python call
chain) is paid once per batch rather than once per message; with no load a
request goes out at once, alone.

A `GroupCommitter[T, R]` takes payloads of type T (`submit`, or
`submit_then` with a callback instead of a future) and hands each batch, a
list of `Pending[T, R]`, to its `flush` function, which resolves every
request with an R (the broker: `Records` -> `SendAck` for sends, control
operations -> the entry's index for controls). `flush` returns an awaitable
(a coroutine runs in a task of its own, a future is only watched), or None
and calls `finish(batch)` when it is done: the send path's, which proposes
with a completion callback and answers its requests from it, so that from
the commit to the answers there is neither a task nor a loop hop.
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

# A request's outcome, told synchronously: (result, None) or (None, error).
Then = Callable[["R | None", "BaseException | None"], None]


@dataclass(eq=False, slots=True)
class Pending(Generic[T, R]):
    """One request waiting to be part of a proposal; `flush` resolves it.

    Its caller learns the outcome either through `future` (`submit`) or
    through `then`, called at once when the flush resolves it (`submit_then`:
    the per-message path, which answers its client without a loop hop)."""

    payload: T
    size: int  # bytes, counted against max_bytes
    count: int  # messages, counted against max_count
    future: asyncio.Future[R] | None = field(default=None, repr=False)
    then: Then[R] | None = field(default=None, repr=False)
    answered: bool = False

    @property
    def done(self) -> bool:
        """Answered (or, for a future, cancelled: its caller left)."""
        return self.answered or (self.future is not None and self.future.done())

    def resolve(self, result: R) -> None:
        self._settle(result, None)

    def fail(self, error: BaseException) -> None:
        self._settle(None, error)

    def _settle(self, result: R | None, error: BaseException | None) -> None:
        """The first outcome only; a caller that left (cancelled future) gets none."""
        if self.done:
            return
        self.answered = True
        if self.then is not None:
            self.then(result, error)
        elif error is not None:
            assert self.future is not None
            self.future.set_exception(error)
        else:
            assert self.future is not None
            self.future.set_result(result)  # type: ignore[arg-type]  # R, resolved above


# A flush either returns an awaitable that ends when the batch has been
# answered, or None: then it calls `GroupCommitter.finish(batch)` itself
# once it has (maybe before it returns).
Flush = Callable[[list[Pending[T, R]]], Awaitable[Any] | None]


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
        self._running = 0  # batches flushed and not finished
        self._watched: set[asyncio.Future[Any]] = set()  # their awaitables, if any
        self._idle: asyncio.Future[None] | None = None  # close() waits on it
        self._starting = False
        self.batches = 0
        self.items = 0

    def submit(self, payload: T, size: int = 0, count: int = 1) -> asyncio.Future[R]:
        """Queue a request; the future resolves with what `flush` sets for it."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append(Pending(payload, size, count, future))
        self._kick()
        return future

    def submit_then(self, payload: T, size: int, count: int, then: Then[R]) -> None:
        """Queue a request whose outcome goes to `then(result, error)`, called
        once, synchronously, when the flush resolves it."""
        self._queue.append(Pending(payload, size, count, None, then))
        self._kick()

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
        if self._queue and not self._starting and self._running < self.max_inflight:
            self._starting = True
            asyncio.get_running_loop().call_soon(self._start)

    def _start(self) -> None:
        self._starting = False
        if not self._queue:
            return
        batch = self._take()
        self.batches += 1
        self.items += len(batch)
        self._running += 1
        try:
            flushing = self._flush(batch)
        except Exception as exc:  # raised before anything was proposed
            self.finish(batch, exc)
            return
        if flushing is not None:
            watched = asyncio.ensure_future(flushing)
            self._watched.add(watched)
            watched.add_done_callback(partial(self._flushed, batch))
        self._kick()  # what did not fit may start another proposal

    def _flushed(self, batch: list[Pending[T, R]], flushing: asyncio.Future[Any]) -> None:
        self._watched.discard(flushing)
        if flushing.cancelled():
            self.finish(batch, asyncio.CancelledError())
        else:
            self.finish(batch, flushing.exception())

    def finish(self, batch: list[Pending[T, R]], error: BaseException | None = None) -> None:
        """A flushed batch is over: its requests not answered yet get `error`
        (or a RuntimeError: the flush left them), and its slot is free."""
        _fail(batch, error if error is not None
              else RuntimeError("flush left a request unanswered"))
        self._running -= 1
        if self._idle is not None and self._running == 0 and not self._idle.done():
            self._idle.set_result(None)
        self._kick()

    async def close(self) -> None:
        """Fail queued requests and wait (up to 5 s) for proposals in flight."""
        while self._queue:
            self._queue.popleft().fail(ConnectionAbortedError("broker stopping"))
        if self._running:
            self._idle = asyncio.get_running_loop().create_future()
            await asyncio.wait([self._idle], timeout=5.0)


def _fail(batch: list[Pending[T, R]], error: BaseException) -> None:
    """Every request of `batch` not answered yet gets `error` (after a flush
    that answered them all, as it should, a look at each is all this costs)."""
    for pending in batch:
        if not pending.answered:
            pending.fail(error)
