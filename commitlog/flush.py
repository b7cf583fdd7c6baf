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
import heapq
import itertools
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from commitlog.entry import Entry
from commitlog.errors import StorageError
from commitlog.log import CommitLog


class Flusher:
    """Runs one CommitLog's flush policy. Start it on the loop that appends."""

    def __init__(self, log: CommitLog) -> None:
        self.log = log
        self.sync_mode = log.config.flush == "sync"
        self._interval_s = log.config.flush_interval_ms / 1000
        self._checkpoint_interval_s = log.config.checkpoint_interval_ms / 1000
        self._flush_bytes = log.config.flush_bytes
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsync")
        self._wake = asyncio.Event()
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # heap by index
        self._order = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._synced_end = log.end
        self._last_checkpoint = time.monotonic()
        # Figures for benchmarks and metrics.
        self.syncs = 0
        self.synced_entries = 0

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="flusher")

    async def append(self, entries: Sequence[Entry]) -> None:
        """Append; under `flush="sync"` return only once the entries are durable."""
        self.log.append(entries)
        self.appended()
        if self.sync_mode:
            await self.wait_durable(self.log.last_index)

    def appended(self) -> None:
        """Tell the flusher that bytes were written (after `log.append`)."""
        if self.sync_mode or self.log.end - self._synced_end >= self._flush_bytes:
            self._wake.set()

    async def wait_durable(self, index: int) -> None:
        """Wait until entry `index` is covered by an fsync."""
        if self.log.durable_index >= index:
            return
        if self.log.failed is not None:
            raise StorageError(f"commitlog failed: {self.log.failed}")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (index, next(self._order), future))
        self._wake.set()
        await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._waiters and not self._closing:
                timeout = None if self.sync_mode else self._interval_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            if self.log.durable_index < self.log.last_index:
                token = self.log.begin_sync()
                try:
                    await loop.run_in_executor(self._executor, self.log.run_sync, token)
                except OSError as exc:
                    self._fail(exc, token)
                    return
                before = self.log.durable_index
                self.log.finish_sync(token)
                self._synced_end = token.end
                self.syncs += 1
                self.synced_entries += self.log.durable_index - before
            self._release()
            if time.monotonic() - self._last_checkpoint >= self._checkpoint_interval_s:
                await self._checkpoint(loop)
            if self._closing and self.log.durable_index >= self.log.last_index:
                return

    async def _checkpoint(self, loop: asyncio.AbstractEventLoop) -> None:
        token = self.log.begin_checkpoint()
        await loop.run_in_executor(self._executor, self.log.run_checkpoint, token)
        self._last_checkpoint = time.monotonic()

    def _release(self) -> None:
        durable = self.log.durable_index
        while self._waiters and self._waiters[0][0] <= durable:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)
        # Entries truncated away (Raft repair) can no longer become durable at
        # their old index: their waiters see the failure rather than hanging.
        while self._waiters and self._waiters[0][0] > self.log.last_index:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_exception(StorageError("entry was truncated before it was synced"))

    def _fail(self, exc: OSError, token: object) -> None:
        with contextlib.suppress(StorageError):
            self.log.finish_sync(token, exc)  # type: ignore[arg-type]
        error = StorageError(f"fsync failed: {exc}")
        for _, _, future in self._waiters:
            if not future.done():
                future.set_exception(error)
        self._waiters.clear()

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
