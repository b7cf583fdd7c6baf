"""When the broker writes its state snapshots, and writing one.

A snapshot is the broker state (`BrokerState.to_snapshot`) at an applied
index, stored with `commitlog.snapshot.write_snapshot`. It bounds start-up (a
start replays only the log after the newest one), bounds retention (no
segment holding entries after the newest snapshot's end is deleted) and is
what a follower behind retention is sent (the runtime streams it).

`SnapshotSchedule.note_applied` is called after every applied batch; once
`snapshot_interval_entries` entries or `snapshot_interval_bytes` of log have
been applied since the last snapshot it starts a write: the state is captured
on the event loop at the applied index A (a copy, so the state moves on),
the local CommitLog is made durable up to A (a snapshot must never be ahead
of the log it continues), the capture is encoded and written on a thread,
then the runtime is told (`note_snapshot`) so it can send it. One write at a
time; a failed one is logged and retried at the next trigger.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from commitlog import StorageError
from commitlog.snapshot import SnapshotInfo, write_snapshot
from dledger.membership import encode as encode_membership
from ledgermq.broker.runtime import RaftRuntime
from ledgermq.broker.state import BrokerState

log = logging.getLogger(__name__)

# Snapshots kept on disk: the newest, and one to fall back to if it is damaged.
KEEP = 2


@dataclass
class SnapshotFigures:
    """What the schedule did, for status and metrics."""

    written: int = 0
    failed: int = 0
    last_index: int = 0
    last_bytes: int = 0
    last_seconds: float = 0.0

    def to_json(self) -> dict[str, int | float]:
        return {"written": self.written, "failed": self.failed, "last_index": self.last_index,
                "last_bytes": self.last_bytes, "last_seconds": round(self.last_seconds, 4)}


class SnapshotSchedule:
    """Writes the broker's snapshots every `interval_entries` applied entries
    or `interval_bytes` of log (0: that trigger off). `state` returns the
    current BrokerState (the object is replaced by a snapshot install)."""

    def __init__(self, data_dir: str, node: RaftRuntime, state: Callable[[], BrokerState],
                 interval_entries: int, interval_bytes: int, keep: int = KEEP) -> None:
        self.data_dir = data_dir
        self.node = node
        self.state = state
        self.interval_entries = interval_entries
        self.interval_bytes = interval_bytes
        self.keep = keep
        self.latest: SnapshotInfo | None = None
        self.figures = SnapshotFigures()
        self._base_index = 0  # applied index and log position the intervals count from
        self._base_end = 0
        self._writing: asyncio.Task[SnapshotInfo | None] | None = None

    def start_from(self, info: SnapshotInfo | None, index: int = 0, end: int = 0) -> None:
        """Count the intervals from `info` (the snapshot a start restored or an
        install adopted), else from entry `index` ending at `end`."""
        if info is not None:
            self.latest = info
            index, end = info.index, info.end_position
        self._base_index, self._base_end = index, end

    @property
    def enabled(self) -> bool:
        """Whether this broker writes snapshots at all (both intervals 0: never,
        and nothing asks for one: retention then deletes nothing)."""
        return bool(self.interval_entries or self.interval_bytes)

    def due(self) -> bool:
        applied = self.state().applied_index
        if self.interval_entries and applied - self._base_index >= self.interval_entries:
            return True
        return bool(self.interval_bytes
                    and self.node.log.end - self._base_end >= self.interval_bytes)

    def note_applied(self) -> None:
        """After an applied batch: start a snapshot if one is due and none is
        being written."""
        if self.enabled and self.due() and not self.busy:
            self._writing = asyncio.ensure_future(self._write())

    @property
    def busy(self) -> bool:
        return self._writing is not None and not self._writing.done()

    async def snapshot_now(self) -> SnapshotInfo | None:
        """Write a snapshot at the current applied index (after the one in
        flight, if any); None if nothing was applied since the latest."""
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
        self._writing = asyncio.ensure_future(self._write())
        return await self._writing

    async def close(self) -> None:
        """Wait for the write in flight (a snapshot is worth finishing: the
        next start replays less)."""
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)

    async def _write(self) -> SnapshotInfo | None:
        state, log_ = self.state(), self.node.log
        index = state.applied_index
        if index < log_.first_index or (self.latest is not None
                                        and index <= self.latest.index):
            return self.latest  # nothing applied since (e.g. right after an install)
        started = time.perf_counter()
        term, end = log_.term_at(index), log_.entry_end(index)
        # The configuration in effect at the index goes into the snapshot's
        # meta: a node started from it (or installing it) must know its group.
        try:
            membership = encode_membership(self.node.membership_at(index))
        except LookupError:
            return self.latest  # a later snapshot is being installed: it replaces this state
        capture = state.capture()
        # The intervals restart now, so a slow write is not started again.
        self._base_index, self._base_end = index, end
        try:
            await self.node.wait_durable(index)
            data = await asyncio.to_thread(capture.encode)
            info = await asyncio.to_thread(write_snapshot, self.data_dir, index, term, end,
                                           data, self.keep, membership=membership)
        except Exception as exc:  # a failed snapshot must not stop the broker
            # The log still holds everything after the previous snapshot
            # (retention never passes it), so nothing is lost: retry later.
            self.figures.failed += 1
            level = logging.ERROR if isinstance(exc, (OSError, StorageError)) else logging.CRITICAL
            log.log(level, "snapshot at index %d failed: %r", index, exc, exc_info=True)
            return None
        seconds = time.perf_counter() - started
        figures = self.figures
        figures.written += 1
        figures.last_index, figures.last_bytes, figures.last_seconds = index, len(data), seconds
        if self.latest is not None and info.index <= self.latest.index:
            return self.latest  # an install adopted a newer one meanwhile
        self.latest = info
        note = getattr(self.node, "note_snapshot", None)
        if note is not None:  # a runtime that can send snapshots to followers
            note(info)
        log.info("snapshot at index %d: %d bytes in %.3f s", index, len(data), seconds)
        return info
