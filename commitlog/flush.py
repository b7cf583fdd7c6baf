"""Flush policies on asyncio: group commit for `sync`, a background flusher for `async`.

One flusher task owns every fsync of a CommitLog. With `flush="sync"` an
append's `wait_durable` completes only after an fdatasync covered it; appends
that arrive while an fsync is running are all covered by the next one, so N
concurrent appenders pay for far fewer than N fsyncs (group commit). With
`flush="async"` appends complete at once and the flusher syncs every
`flush_interval_ms` or when `flush_bytes` are unsynced. In both modes the
checkpoint is rewritten at most every `checkpoint_interval_ms`.

fdatasync runs on a dedicated thread so the event loop keeps accepting
appends meanwhile; everything else runs on the loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from commitlog.entry import Entry
from commitlog.errors import PositionMismatchError, StorageError
from commitlog.log import CommitLog, SyncToken
from commitlog.sync_thread import SyncThread

T = TypeVar("T")


@dataclass(slots=True)
class _Queued:
    """One `append_new` call waiting for its round to place and write it."""

    term: int
    items: Sequence[tuple[int, bytes]]
    future: asyncio.Future[None]
    last_index: int = 0
    generation: int = 0


class FlushObserver(Protocol):
    """Told of every completed fsync round, on the event loop (the broker's
    metrics implement it; `NO_FLUSH_OBSERVER` ignores it)."""

    def synced(self, seconds: float, entries: int) -> None:
        """One round's fdatasync took `seconds` and made `entries` durable."""


class _IgnoreFlushes:
    def synced(self, seconds: float, entries: int) -> None:
        pass


NO_FLUSH_OBSERVER: FlushObserver = _IgnoreFlushes()


class Worker(Protocol):
    """Runs blocking calls (fsync, file replacement) off the event loop, one at
    a time and in order: `SyncThread` in production, a seeded virtual-time
    worker in the real-node simulator."""

    def submit(self, fn: Callable[[Any], T], arg: Any) -> asyncio.Future[T]: ...

    def shutdown(self) -> None: ...


class Flusher:
    """Runs one CommitLog's flush policy. Start it on the loop that appends.

    Any error of the flush task (an fsync, a checkpoint write: EIO, ENOSPC,
    or a bug) fails the log for good: `failed` and `log.failed` say why, every
    waiter and every later append raises `StorageError`, and `on_failure` is
    called once so the owner stops serving. Nothing waits forever on a flusher
    that is gone.
    """

    def __init__(self, log: CommitLog, sync: bool | None = None,
                 split_after_s: float | None = None, *,
                 worker: Worker | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 on_failure: Callable[[BaseException], None] | None = None,
                 observer: FlushObserver = NO_FLUSH_OBSERVER) -> None:
        """`sync` overrides the log's configured policy (True: flush=sync).
        `split_after_s` fixes when a loop pass starts its sync early (see
        `_join_next`); None adapts it to the measured sync time. `worker`
        runs the fsyncs (a `SyncThread` by default), `clock` times rounds and
        checkpoint intervals; `observer` is told of every round."""
        self.log = log
        self._observer = observer
        self.failed: BaseException | None = None
        self._on_failure = on_failure
        self._clock = clock
        self.sync_mode = log.config.flush == "sync" if sync is None else sync
        self._interval_s = log.config.flush_interval_ms / 1000
        self._checkpoint_interval_s = log.config.checkpoint_interval_ms / 1000
        self._flush_bytes = log.config.flush_bytes
        self._thread: Worker = worker if worker is not None else SyncThread("fsync")
        # When a round starts before the loop pass ends (see _join_next): a
        # fixed delay, or None for the running estimate of a sync's duration.
        self._split_after_s = split_after_s
        self._sync_estimate_s: float | None = None
        self._next_since = 0.0
        self._wake = asyncio.Event()
        # Waiters are grouped per sync round: the round in flight covers
        # entries up to _inflight_index; everything appended later waits for
        # the next round. Each waiter has its own future (so cancelling one
        # waiter cannot cancel the others), completed together.
        self._inflight: list[asyncio.Future[None]] | None = None
        self._inflight_index = 0
        self._next: list[asyncio.Future[None]] | None = None
        # append_new calls of the next round, placed and written when it starts.
        self._queued: list[_Queued] = []
        # The sync of the round in flight, started by the flusher task or, to
        # overlap a large cohort's appends with its fsync, by an appender.
        self._round: asyncio.Future[tuple[float, float]] | None = None
        self._round_token: SyncToken | None = None
        self._round_submitted = 0.0
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._synced_end = log.end
        self._last_checkpoint = clock()
        # Figures for benchmarks and metrics. Per sync round, in seconds:
        # from handing the fsync to its thread until the thread starts it
        # (`sync_start_wait_s`), the fdatasync itself (`sync_s`), and from its
        # return until the event loop resumes the round (`sync_resume_wait_s`).
        self.syncs = 0
        self.inline_syncs = 0  # of those, run on the loop's thread (`sync_now`)
        self.synced_entries = 0
        self.early_rounds = 0  # rounds started before their loop pass ended
        self.sync_start_wait_s = 0.0
        self.sync_s = 0.0
        self.sync_resume_wait_s = 0.0

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="flusher")

    async def append(self, entries: Sequence[Entry]) -> None:
        """Append; under `flush="sync"` return only once the entries are durable."""
        log = self.log
        self._check_alive()
        log.append(entries)
        if not self.sync_mode:
            if log.end - self._synced_end >= self._flush_bytes:
                self._wake.set()
            return
        # Inline of wait_durable for the hot path: join the next sync round.
        index, generation = log.last_index, log.generation
        future = asyncio.get_running_loop().create_future()
        self._join_next(future)
        await future
        if log.durable_index < index or log.generation != generation:
            await self.wait_durable(index, generation)  # rare: truncated, or a later round

    async def append_new(self, term: int, items: Sequence[tuple[int, bytes]]) -> int:
        """Place and append new entries (kind, body) as the log's only writer;
        return the index of the last one.

        Under `flush="sync"` the entries are placed and written when the next
        sync round starts, together with those of every other `append_new` of
        the loop pass: one write and one fsync for all of them, and the call
        returns once they are durable. If that write fails (a full disk), every
        caller of the round gets the error and nothing of the round is kept; a
        call cancelled before its round starts writes nothing. Under
        `flush="async"` the entries are written at once.
        """
        log = self.log
        if not items:
            raise ValueError("append_new needs at least one entry")
        log.check_items(items)
        if not self.sync_mode:
            entries = log.build_entries(term, items)
            await self.append(entries)
            return entries[-1].index
        self._check_alive()
        # Terms already queued passed this check, so the last one is the floor.
        floor = self._queued[-1].term if self._queued else log.last_term
        if term < floor:
            raise PositionMismatchError(f"entry term {term} is below {floor}")
        queued = _Queued(term, items, asyncio.get_running_loop().create_future())
        self._queued.append(queued)
        self._join_next(queued.future)
        await queued.future
        if log.durable_index < queued.last_index or log.generation != queued.generation:
            await self.wait_durable(queued.last_index, queued.generation)
        return queued.last_index

    def _write_queued(self) -> None:
        """Place and write the round's `append_new` entries in one append."""
        queued = [q for q in self._queued if not q.future.done()]  # done: cancelled
        self._queued = []
        if not queued:
            return
        log = self.log
        try:
            lasts = log.append_new([(q.term, q.items) for q in queued], checked=True)
        except Exception as exc:  # nothing of the round was kept: all of it fails
            for q in queued:
                q.future.set_exception(exc)
            return
        generation = log.generation
        for q, last in zip(queued, lasts, strict=True):
            q.last_index, q.generation = last, generation

    def appended(self) -> None:
        """Tell the flusher that bytes were written (after `log.append`)."""
        if self.sync_mode or self.log.end - self._synced_end >= self._flush_bytes:
            self._wake.set()

    async def wait_durable(self, index: int, generation: int | None = None) -> None:
        """Wait until entry `index` is covered by an fsync. Raises StorageError
        if the log failed or the entry was truncated away meanwhile (since
        `generation`, the log's generation when the entry was appended)."""
        log = self.log
        if generation is None:
            generation = log.generation
        while log.durable_index < index:
            self._check_alive()
            if index > log.last_index:
                raise StorageError(f"entry {index} is not in the log (truncated)")
            future = asyncio.get_running_loop().create_future()
            if self._inflight is not None and index <= self._inflight_index:
                self._inflight.append(future)
            else:
                self._join_next(future)
            await future
        cut = log.cut_since(generation)
        if cut is not None and cut < index:
            raise StorageError(f"entry {index} was truncated before it was synced")

    def _join_next(self, future: asyncio.Future[None]) -> None:
        """Make `future` wait for the next sync round.

        The next round normally starts once the loop has run what was ready
        (the flusher task's turn), so one fsync covers every append of that
        loop pass. But when no round is in flight and the appends joined so
        far took as long as a sync takes, it starts at once: the rest of the
        pass then appends while this part's fsync runs on its thread, instead
        of the loop idling through every fsync. A pass shorter than a sync
        never splits, so a slow disk keeps whole-pass rounds
        (docs/architecture.md has the measurements).
        """
        if self._next is None:
            self._next = []
            self._next_since = self._clock()
            self._wake.set()
        self._next.append(future)
        if self._round is None:
            split_after = self._split_after_s
            if split_after is None:
                split_after = self._sync_estimate_s
            if split_after is not None and (
                    self._clock() - self._next_since >= split_after):
                self.early_rounds += 1
                self._begin_round()

    def _begin_round(self) -> bool:
        """Start syncing what is written; the waiters so far join this round.
        Returns False when there was nothing to sync (waiters are released)."""
        round_waiters, self._next = self._next or [], None
        if self._queued:
            self._write_queued()
        if self.log.durable_index >= self.log.last_index:
            for future in round_waiters:
                if not future.done():
                    future.set_result(None)
            return False
        token = self.log.begin_sync()
        self._inflight, self._inflight_index = round_waiters, token.index
        self._round_token = token
        self._round_submitted = self._clock()
        self._round = self._thread.submit(self._timed_sync, token)
        return True

    @property
    def idle(self) -> bool:
        """flush="sync" with no round in flight or queued: `sync_now` would sync."""
        return (self.sync_mode and self._round is None and not self._queued
                and not self._closing and self.failed is None)

    def sync_now(self) -> bool:
        """flush="sync": make everything written durable right here, on the
        loop's thread, when no round is in flight or queued (else False:
        wait for the rounds instead). A small sync costs less than handing
        it to the fsync thread and back (about 0.18 ms per round on this
        project's VM, more than the fdatasync of a small entry), and a
        Raft follower, whose acknowledgements wait for the sync, has
        nothing else to do meanwhile. Raises StorageError when the fsync
        fails (the log is failed for good, as in a round)."""
        if (not self.sync_mode or self._round is not None or self._queued
                or self._closing):
            return False
        self._check_alive()
        log = self.log
        if log.durable_index >= log.last_index:
            return True
        token = log.begin_sync()
        started = self._clock()
        try:
            log.run_sync(token)
        except Exception as exc:  # OSError from fdatasync; anything else is a bug
            self._fail(exc, token, [])
            self._fail_for_good(exc)
            raise StorageError(f"fsync failed: {exc}") from exc
        ended = self._clock()
        before = log.durable_index
        log.finish_sync(token)
        self._synced_end = token.end
        self.syncs += 1
        self.inline_syncs += 1
        self.sync_s += ended - started
        self.synced_entries += log.durable_index - before
        self._observer.synced(ended - started, log.durable_index - before)
        if ended - self._last_checkpoint >= self._checkpoint_interval_s:
            self._wake.set()  # the flusher task writes the checkpoint, off the loop
        return log.durable_index >= log.last_index

    def _check_alive(self) -> None:
        failed = self.failed or self.log.failed
        if failed is not None:
            raise StorageError(f"commitlog failed: {failed!r}")

    async def _run(self) -> None:
        try:
            await self._run_rounds()
        except Exception as exc:  # not CancelledError or GeneratorExit: those are no failure
            self._fail_for_good(exc)

    def _fail_for_good(self, exc: BaseException) -> None:
        """The flush task cannot go on: fail the log, every waiter and every
        later call, and tell the owner (once)."""
        if self.failed is not None:
            return
        self.failed = exc
        if self.log.failed is None:
            self.log.failed = exc
        error = StorageError(f"flusher failed: {exc!r}")
        waiters = [*(self._inflight or ()), *(self._next or ()),
                   *(q.future for q in self._queued)]
        self._inflight, self._next, self._queued = None, None, []
        for future in waiters:
            if not future.done():
                future.set_exception(error)
        if self._on_failure is not None:
            self._on_failure(exc)

    async def _run_rounds(self) -> None:
        while True:
            if self._next is None and self._round is None and not self._closing:
                timeout = None if self.sync_mode else self._interval_s
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
            self._wake.clear()
            if self._round is not None or self._begin_round():
                await self._finish_round()
                if self.log.failed is not None:
                    raise StorageError(f"fsync failed: {self.log.failed!r}")
                # Let the waiters just released append before the next round
                # starts, so it covers them too (or splits their pass, above).
                await asyncio.sleep(0)
            if self._clock() - self._last_checkpoint >= self._checkpoint_interval_s:
                await self._checkpoint()
            if self._closing and self.log.durable_index >= self.log.last_index:
                for future in self._next or ():
                    if not future.done():
                        future.set_result(None)
                return

    async def _finish_round(self) -> None:
        """Wait for the round in flight, advance the durable point, release its waiters."""
        # The very list wait_durable may still add to while the fsync runs.
        token, round_waiters = self._round_token, self._inflight
        assert round_waiters is not None
        assert self._round is not None and token is not None
        try:
            started, ended = await self._round
        except Exception as exc:  # OSError from fdatasync; anything else is a bug
            self._fail(exc, token, round_waiters)
            return
        finally:
            self._inflight = None
            self._round = None
            self._round_token = None
        self.sync_start_wait_s += started - self._round_submitted
        self.sync_s += ended - started
        # What a round costs the waiters beyond the loop's own work: the
        # hand-off to the fsync thread and the sync (not the hand-back, which
        # grows with how busy the loop is).
        took = ended - self._round_submitted
        estimate = self._sync_estimate_s
        self._sync_estimate_s = took if estimate is None else estimate + (took - estimate) / 8
        self.sync_resume_wait_s += self._clock() - ended
        before = self.log.durable_index
        self.log.finish_sync(token)
        self._synced_end = token.end
        self.syncs += 1
        self.synced_entries += self.log.durable_index - before
        self._observer.synced(ended - started, self.log.durable_index - before)
        for future in round_waiters:
            if not future.done():
                future.set_result(None)
        # A new loop pass starts: the released waiters append next.
        self._next_since = self._clock()

    def _timed_sync(self, token: SyncToken) -> tuple[float, float]:
        """Run on the fsync thread: the sync, and when it started and ended."""
        started = self._clock()
        self.log.run_sync(token)
        return started, self._clock()

    async def _checkpoint(self) -> None:
        # The value is captured now and written on the worker; the log drops
        # it there if a truncation came in between (CommitLog.run_checkpoint).
        token = self.log.begin_checkpoint()
        await self._thread.submit(self.log.run_checkpoint, token)
        self._last_checkpoint = self._clock()

    def _fail(self, exc: Exception, token: SyncToken,
              round_waiters: list[asyncio.Future[None]]) -> None:
        with contextlib.suppress(StorageError):
            self.log.finish_sync(token, exc)
        error = StorageError(f"fsync failed: {exc}")
        for future in [*round_waiters, *(self._next or ())]:
            if not future.done():
                future.set_exception(error)
        self._next = None

    async def close(self) -> None:
        """Sync what is left, write a checkpoint and stop the task."""
        self._closing = True
        self._wake.set()
        try:
            if self._task is not None:
                await self._task
                self._task = None
            if self.failed is None and self.log.failed is None:
                await self._checkpoint()
        finally:
            self._thread.shutdown()
