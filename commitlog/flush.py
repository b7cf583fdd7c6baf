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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from commitlog.entry import Entry
from commitlog.errors import StorageError
from commitlog.log import CommitLog, SyncToken


class Flusher:
    """Runs one CommitLog's flush policy. Start it on the loop that appends."""

    def __init__(self, log: CommitLog, sync: bool | None = None) -> None:
        """`sync` overrides the log's configured policy (True: flush=sync)."""
        self.log = log
        self.sync_mode = log.config.flush == "sync" if sync is None else sync
        self._interval_s = log.config.flush_interval_ms / 1000
        self._checkpoint_interval_s = log.config.checkpoint_interval_ms / 1000
        self._flush_bytes = log.config.flush_bytes
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsync")
        self._wake = asyncio.Event()
        # Waiters are grouped per sync round: the round in flight covers
        # entries up to _inflight_index; everything appended later waits for
        # the next round. Each waiter has its own future (so cancelling one
        # waiter cannot cancel the others), completed together.
        self._inflight: list[asyncio.Future[None]] | None = None
        self._inflight_index = 0
        self._next: list[asyncio.Future[None]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._synced_end = log.end
        self._last_checkpoint = time.monotonic()
        # Figures for benchmarks and metrics. Per sync round, in seconds:
        # from handing the fsync to its thread until the thread starts it
        # (`sync_start_wait_s`), the fdatasync itself (`sync_s`), and from its
        # return until the event loop resumes the round (`sync_resume_wait_s`).
        self.syncs = 0
        self.synced_entries = 0
        self.sync_start_wait_s = 0.0
        self.sync_s = 0.0
        self.sync_resume_wait_s = 0.0

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="flusher")

    async def append(self, entries: Sequence[Entry]) -> None:
        """Append; under `flush="sync"` return only once the entries are durable."""
        log = self.log
        log.append(entries)
        if not self.sync_mode:
            if log.end - self._synced_end >= self._flush_bytes:
                self._wake.set()
            return
        # Inline of wait_durable for the hot path: join the next sync round.
        index, generation = log.last_index, log.generation
        future = asyncio.get_running_loop().create_future()
        if self._next is None:
            self._next = []
            self._wake.set()
        self._next.append(future)
        await future
        if log.durable_index < index or log.generation != generation:
            await self.wait_durable(index, generation)  # rare: truncated, or a later round

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
            if log.failed is not None:
                raise StorageError(f"commitlog failed: {log.failed}")
            if index > log.last_index:
                raise StorageError(f"entry {index} is not in the log (truncated)")
            future = asyncio.get_running_loop().create_future()
            if self._inflight is not None and index <= self._inflight_index:
                self._inflight.append(future)
            else:
                if self._next is None:
                    self._next = []
                    self._wake.set()
                self._next.append(future)
            await future
        cut = log.cut_since(generation)
        if cut is not None and cut < index:
            raise StorageError(f"entry {index} was truncated before it was synced")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self._next is None and not self._closing:
                timeout = None if self.sync_mode else self._interval_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            round_waiters, self._next = self._next or [], None
            if self.log.durable_index < self.log.last_index:
                token = self.log.begin_sync()
                self._inflight, self._inflight_index = round_waiters, token.index
                submitted = time.perf_counter()
                try:
                    started, ended = await loop.run_in_executor(
                        self._executor, self._timed_sync, token)
                except OSError as exc:
                    self._fail(exc, token, round_waiters)
                    return
                finally:
                    self._inflight = None
                self.sync_start_wait_s += started - submitted
                self.sync_s += ended - started
                self.sync_resume_wait_s += time.perf_counter() - ended
                before = self.log.durable_index
                self.log.finish_sync(token)
                self._synced_end = token.end
                self.syncs += 1
                self.synced_entries += self.log.durable_index - before
            for future in round_waiters:
                if not future.done():
                    future.set_result(None)
            if time.monotonic() - self._last_checkpoint >= self._checkpoint_interval_s:
                await self._checkpoint(loop)
            if self._closing and self.log.durable_index >= self.log.last_index:
                for future in self._next or ():
                    if not future.done():
                        future.set_result(None)
                return

    def _timed_sync(self, token: SyncToken) -> tuple[float, float]:
        """Run on the fsync thread: the sync, and when it started and ended."""
        started = time.perf_counter()
        self.log.run_sync(token)
        return started, time.perf_counter()

    async def _checkpoint(self, loop: asyncio.AbstractEventLoop) -> None:
        token = self.log.begin_checkpoint()
        await loop.run_in_executor(self._executor, self.log.run_checkpoint, token)
        self._last_checkpoint = time.monotonic()

    def _fail(self, exc: OSError, token: SyncToken,
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
        if self._task is not None:
            await self._task
            self._task = None
        if self.log.failed is None:
            await self._checkpoint(asyncio.get_running_loop())
        self._executor.shutdown(wait=True)
