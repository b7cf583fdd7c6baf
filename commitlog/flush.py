"""Flush policies on asyncio: pipelined group commit for `sync`, a background
flusher for `async`.

One Flusher owns every fsync of a CommitLog, one job (a sync round or a
checkpoint) at a time; all bookkeeping runs on the event loop thread.

Where the fsyncs run. Sync rounds go through io_uring when the kernel allows
it (`commitlog.disk.Uring`): the loop queues IORING_OP_FSYNC requests, a
kernel worker runs them, and completions are read from shared memory (the
ring's fd is also registered with the loop for when it is idle). No Python
thread is involved, so nothing competes with the loop for the GIL: a Python
fsync thread must retake the GIL to report back, and CPython 3.11 hands it
back to a busy loop after every pwrite, so such a thread starves exactly when
appends are busiest. Otherwise (no io_uring, e.g. under a seccomp profile, or
`log.run_sync` wrapped for metrics) rounds run `log.run_sync` on the
Flusher's one thread, as checkpoints always do.

`flush="sync"` (pipelined group commit): an append's `wait_durable` completes
only after an fdatasync covered it. A round covers everything appended until
it starts (`begin_sync` takes `last_index`); entries appended while it runs
wait for the next round. A finished round is noticed at the next append,
`appended` or `wait_durable` (or when the loop is idle), so the next round can
start without the loop first draining its ready queue: appends overlap the
fsync in flight instead of alternating with it. When the thread is idle, the
next round starts as soon as at least half of the waiters seen at the end of
the previous round are pending (1 with a single appender: at once), or at the
end of the loop's current pass. Under load two cohorts of appenders then
alternate between appending and waiting, and a round is neither one appender's
entry (each round has a fixed cost on the loop) nor all of them (which would
serialize appends and fsyncs again).

`flush="async"`: appends complete at once; a round runs every
`flush_interval_ms`, when `flush_bytes` are unsynced, or when someone waits
for durability.

In both modes the checkpoint is rewritten at most every
`checkpoint_interval_ms`, between rounds. A failed fsync or checkpoint fails
every waiter and marks the log failed. A waiter is completed only when a
round that began after its entry was appended ends (or on failure,
truncation or close), and re-checks `durable_index` and the log's generation
before returning, so it never reports an entry durable that is not.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from commitlog.disk import Uring, record_synced
from commitlog.entry import Entry
from commitlog.errors import StorageError
from commitlog.log import CheckpointToken, CommitLog, SyncToken

_SYNC = 1
_CHECKPOINT = 2


class Flusher:
    """Runs one CommitLog's flush policy. Use it from the loop that appends."""

    def __init__(self, log: CommitLog, sync: bool | None = None) -> None:
        """`sync` overrides the log's configured policy (True: flush=sync)."""
        self.log = log
        self.sync_mode = log.config.flush == "sync" if sync is None else sync
        self._interval_s = log.config.flush_interval_ms / 1000
        self._checkpoint_interval_s = log.config.checkpoint_interval_ms / 1000
        self._flush_bytes = log.config.flush_bytes
        # The fsync thread (started on first use) takes jobs from _jobs.
        self._jobs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # Sync rounds go through io_uring when the kernel allows it (None: not
        # tried yet, False: unavailable): no thread, no GIL hand-off.
        self._ring: Uring | bool | None = None
        self._ring_busy = False  # a round's fsyncs are in the ring
        self._ring_left = 0
        self._ring_error: OSError | None = None
        self._ring_dir_fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        # The job on the fsync thread (_SYNC or _CHECKPOINT, 0: none) and its
        # token. The thread stores (token, error) in _result when the job is
        # done; the loop thread completes the job when it sees _result.
        self._job = 0
        self._job_token: SyncToken | CheckpointToken | None = None
        self._result: tuple[object, BaseException | None] | None = None
        # Waiters are grouped per sync round: the round in flight covers
        # entries up to _inflight_index; everything appended later waits for
        # the next round. Each waiter has its own future (so cancelling one
        # waiter cannot cancel the others), completed together.
        self._inflight: list[asyncio.Future[None]] = []
        self._inflight_index = 0
        self._next: list[asyncio.Future[None]] = []
        self._idle: list[asyncio.Future[None]] = []  # close() waiting for the thread
        self._round_due = False  # async mode: the interval elapsed
        # Under load the next round starts once half of the waiters seen when
        # the last round ended are pending again (or at the end of the loop's
        # current pass): two cohorts then alternate between appending and
        # syncing, and rounds do not shrink to a few entries that each pay a
        # round's fixed cost. With one waiter at a time this is 1: no delay.
        self._min_round = 1
        self._waiting = 0
        self._kick: asyncio.Handle | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self._synced_end = log.end
        self._last_checkpoint = time.monotonic()
        # Figures for benchmarks and metrics.
        self.syncs = 0
        self.synced_entries = 0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if not self.sync_mode:
            self._ticker = self._loop.create_task(self._tick(), name="flusher")

    # ------------------------------------------------------------- public API

    async def append(self, entries: Sequence[Entry]) -> None:
        """Append; under `flush="sync"` return only once the entries are durable."""
        log = self.log
        log.append(entries)
        self._poll()
        if not self.sync_mode:
            if log.end - self._synced_end >= self._flush_bytes and not self._job:
                self._next_job()
            return
        # Inline of wait_durable for the hot path.
        index, generation = log.last_index, log.generation
        future = self._waiter(index)
        await future
        if log.durable_index < index or log.generation != generation:
            await self.wait_durable(index, generation)  # rare: truncated, or a later round

    def appended(self) -> None:
        """Tell the flusher that bytes were written (after `log.append`)."""
        self._poll()
        if not self._job:
            if self.sync_mode:
                self._defer()  # the wait_durable that usually follows may start it sooner
            elif self.log.end - self._synced_end >= self._flush_bytes:
                self._next_job()

    async def wait_durable(self, index: int, generation: int | None = None) -> None:
        """Wait until entry `index` is covered by an fsync. Raises StorageError
        if the log failed or the entry was truncated away meanwhile (since
        `generation`, the log's generation when the entry was appended)."""
        log = self.log
        if generation is None:
            generation = log.generation
        self._poll()
        while log.durable_index < index:
            if log.failed is not None:
                raise StorageError(f"commitlog failed: {log.failed}")
            if index > log.last_index:
                raise StorageError(f"entry {index} is not in the log (truncated)")
            await self._waiter(index)
        cut = log.cut_since(generation)
        if cut is not None and cut < index:
            raise StorageError(f"entry {index} was truncated before it was synced")

    async def close(self) -> None:
        """Sync what is left, write a checkpoint and stop."""
        self._closing = True
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        with contextlib.suppress(StorageError):
            await self.wait_durable(self.log.last_index)
        await self._wait_idle()
        if self.log.failed is None:
            self._submit(_CHECKPOINT, self.log.begin_checkpoint(), self.log.run_checkpoint)
            await self._wait_idle()
        self._closed = True
        if self._kick is not None:
            self._kick.cancel()
            self._kick = None
        self._release(self._next, None)
        self._drop_ring()
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    # ---------------------------------------------------------------- rounds

    def _waiter(self, index: int) -> asyncio.Future[None]:
        """A future completed by the first round that covers `index` (which
        must be appended already); starts or schedules the next round when no
        job is running."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._job == _SYNC and index <= self._inflight_index:
            self._inflight.append(future)
        else:
            self._next.append(future)
            if not self._job:
                if len(self._next) >= self._min_round:
                    self._next_job()
                else:
                    self._defer()
        return future

    def _defer(self) -> None:
        """Start the next job at the end of the loop's current pass, unless
        enough waiters start it sooner."""
        if self._kick is None:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            self._kick = loop.call_soon(self._deferred_kick)

    def _deferred_kick(self) -> None:
        self._kick = None
        self._poll()
        if not self._job:
            self._next_job()

    def _next_job(self) -> None:
        """Start the next job, if there is one (no job is running)."""
        log = self.log
        if self._kick is not None:
            self._kick.cancel()  # this is the kick it was waiting for
            self._kick = None
        if self._closed or log.failed is not None:
            error = StorageError(f"commitlog failed: {log.failed}" if log.failed is not None
                                 else "the flusher is closed")
            self._release(self._next, error)
            self._release(self._idle, None)
            return
        undurable = log.durable_index < log.last_index
        if (not self._closing
                and time.monotonic() - self._last_checkpoint >= self._checkpoint_interval_s):
            self._submit(_CHECKPOINT, log.begin_checkpoint(), log.run_checkpoint)
        elif undurable and (self.sync_mode or self._next or self._round_due or self._closing
                            or log.end - self._synced_end >= self._flush_bytes):
            token = log.begin_sync()
            self._round_due = False
            self._inflight, self._next = self._next, []
            self._inflight_index = token.index
            self._start_round(token)
        else:
            # Nothing to sync (e.g. the entries waited for were truncated):
            # the waiters re-check and report.
            self._round_due = self._round_due and undurable
            self._release(self._next, None)
            self._release(self._idle, None)

    def _poll(self) -> None:
        """Complete a finished job now (cheap when there is none): called on
        every append so a busy loop starts the next round without waiting to
        drain its ready queue."""
        if self._ring_busy:
            if self._ring.pending():  # type: ignore[union-attr]
                self._reap()
        elif self._result is not None:
            self._complete()

    def _uring(self) -> Uring | None:
        """The ring for sync rounds, or None to use the thread: when the
        kernel refuses io_uring (old kernel, seccomp), or when `run_sync` is
        wrapped (metrics time it: the wrapper must run)."""
        ring = self._ring
        if ring is None:
            ring = False
            if "run_sync" not in vars(self.log):
                with contextlib.suppress(OSError, AttributeError, ValueError):
                    ring = Uring()
                    loop = self._loop
                    if loop is None:
                        loop = self._loop = asyncio.get_running_loop()
                    try:
                        loop.add_reader(ring.fd, self._poll)
                    except BaseException:
                        ring.close()
                        ring = False
            self._ring = ring
        return ring or None

    def _start_round(self, token: SyncToken) -> None:
        ring = self._uring()
        if ring is not None and "run_sync" not in vars(self.log):
            fsyncs = [(fd, True) for fd, _path, _length in token.fds]
            try:
                if token.directory_dirty:
                    # A new segment's name must be durable too (full fsync).
                    self._ring_dir_fd = os.open(self.log.segments.directory,
                                                os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    fsyncs.append((self._ring_dir_fd, False))
                if fsyncs:
                    ring.submit(fsyncs, self.syncs)
            except OSError:
                # Give up on the ring; the thread takes over (and reports a
                # directory that cannot be synced as a failed sync).
                self._close_dir_fd()
                self._drop_ring()
            else:
                self._job, self._job_token = _SYNC, token
                self._ring_busy, self._ring_left, self._ring_error = True, len(fsyncs), None
                if not fsyncs:
                    self._finish_ring_round()
                return
        self._submit(_SYNC, token, self.log.run_sync)

    def _drop_ring(self) -> None:
        ring, self._ring = self._ring, False
        if isinstance(ring, Uring):
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(ring.fd)
            ring.close()

    def _reap(self) -> None:
        for _user_data, result in self._ring.reap():  # type: ignore[union-attr]
            if result < 0 and self._ring_error is None:
                self._ring_error = OSError(-result, os.strerror(-result))
            self._ring_left -= 1
        if self._ring_left <= 0:
            self._finish_ring_round()

    def _finish_ring_round(self) -> None:
        self._ring_busy = False
        self._close_dir_fd()
        token = self._job_token
        assert isinstance(token, SyncToken)
        if self._ring_error is None:
            record_synced(token.fds)
        self._result = (token, self._ring_error)
        self._complete()

    def _close_dir_fd(self) -> None:
        if self._ring_dir_fd >= 0:
            os.close(self._ring_dir_fd)
            self._ring_dir_fd = -1

    def _submit(self, kind: int, token: SyncToken | CheckpointToken,
                run: Callable[[Any], None]) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="fsync", daemon=True)
            self._thread.start()
        self._job, self._job_token = kind, token
        self._jobs.put((loop, run, token))

    def _work(self) -> None:
        """The fsync thread: run each job, publish its result, wake the loop.
        It needs the GIL only to take a job and to report it."""
        get = self._jobs.get
        while (job := get()) is not None:
            loop, run, token = job
            error: BaseException | None = None
            try:
                run(token)
            except BaseException as exc:  # reported to every waiter
                error = exc
            self._result = (token, error)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._complete)
            del job, loop, run, token, error

    def _complete(self) -> None:
        """On the loop: finish the job the thread has finished (if any), then
        start the next one."""
        result = self._result
        if result is None:
            return  # already completed by an append that saw it first
        self._result = None
        token, error = result
        kind, self._job, self._job_token = self._job, 0, None
        log = self.log
        if kind == _SYNC:
            assert isinstance(token, SyncToken)
            waiters, self._inflight = self._inflight, []
            if error is not None:
                with contextlib.suppress(StorageError):
                    log.finish_sync(token, error)  # marks the log failed
                self._fail(StorageError(f"fsync failed: {error}"), waiters)
                return
            before = log.durable_index
            log.finish_sync(token)
            self._synced_end = token.end
            self.syncs += 1
            self.synced_entries += log.durable_index - before
            self._release(waiters, None)
            # Waiters in play: decays by one a round so that it follows the load.
            self._waiting = max(len(waiters) + len(self._next), self._waiting - 1)
            self._min_round = max(1, self._waiting // 2)
            if self.sync_mode and len(self._next) < self._min_round and not self._closing:
                self._defer()
                return
        else:
            if error is not None:
                if log.failed is None:
                    log.failed = error
                self._fail(StorageError(f"checkpoint failed: {error}"), [])
                return
            self._last_checkpoint = time.monotonic()
        self._next_job()

    def _fail(self, error: StorageError, waiters: list[asyncio.Future[None]]) -> None:
        self._release(waiters, error)
        self._release(self._next, error)
        self._release(self._idle, None)

    @staticmethod
    def _release(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
        for future in futures:
            if not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
        futures.clear()

    async def _wait_idle(self) -> None:
        while self._job:
            future = asyncio.get_running_loop().create_future()
            self._idle.append(future)
            await future

    async def _tick(self) -> None:
        """Async mode: a round every flush_interval_ms (and due checkpoints)."""
        while True:
            await asyncio.sleep(self._interval_s)
            self._poll()
            self._round_due = True
            if not self._job:
                self._next_job()
