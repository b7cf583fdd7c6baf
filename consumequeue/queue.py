"""One ConsumeQueue: the fixed-width index of one (topic, queue id).

A queue offset is a slot number. Files hold `units_per_file` slots and are
named by the offset of their first slot (`commitlog.file_queue` keeps them).
Leading slots may be empty (removed by retention or never held here);
everything from `min_offset` to `max_offset` is filled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commitlog.disk import DirtyFile, sync_and_close, sync_directory
from commitlog.file_queue import FileQueue
from consumequeue.unit import UNIT_SIZE, decode_units, encode_units


@dataclass(frozen=True, slots=True)
class Unit:
    queue_offset: int
    physical_offset: int
    size: int
    tag_hash: int


class ConsumeQueue:
    """Files of one (topic, queue id). Invariant: min_offset <= max_offset, and
    every slot in [min_offset, max_offset) holds a non-empty unit."""

    def __init__(self, directory: str, topic: str, queue_id: int, units_per_file: int,
                 trusted_next: int | None = None) -> None:
        """Open the queue's files and find its bounds. `trusted_next`: a
        next offset the dispatch checkpoint vouches for (every slot below it
        was fsynced and not rewritten since); the files below it are then
        checked by their length only and the rest is scanned, so the open
        reads the tail written after that checkpoint, not the whole queue."""
        self.directory = directory
        self.topic = topic
        self.queue_id = queue_id
        self.units_per_file = units_per_file
        self.files = FileQueue(directory, units_per_file, unit_size=UNIT_SIZE)
        self.foreign = self.files.foreign
        self.max_offset = 0
        self.min_offset = 0
        self._trim_partial_units()
        self._find_bounds(trusted_next)

    def _trim_partial_units(self) -> None:
        """A crash can leave a unit half written at a file's end: drop it."""
        for base, length in list(self.files.lengths.items()):
            self.files.cut(base, length - length % UNIT_SIZE)

    def _find_bounds(self, trusted_next: int | None) -> None:
        """min_offset = first filled slot; max_offset = end of the contiguous
        filled run from there. Anything after a hole is cut: a crash can tear an
        earlier file while a later one survives (writeback order is arbitrary),
        and units after a hole cannot be trusted to be the next messages.

        With an intact trusted prefix (see `__init__`) the slots below
        `trusted_next` are known to be leading empty slots then filled ones, so
        the first filled one is found by a binary search of single units and
        the scan starts at `trusted_next`. Anything else about that prefix (a
        file missing or short: the files are not what the checkpoint saw)
        falls back to scanning every file."""
        self.min_offset = self.max_offset = 0
        started = False
        scan_from = 0
        if trusted_next is not None and self._prefix_intact(trusted_next):
            scan_from = trusted_next
            first = self._first_filled_below(trusted_next)
            if first is not None:
                started = True
                self.min_offset, self.max_offset = first, trusted_next
        for base in list(self.files.bases):
            skip = max(0, scan_from - base)  # this file's slots known already
            if skip >= self.units_per_file:
                continue
            at = base + skip
            length = max(0, self.files.lengths[base] - skip * UNIT_SIZE)
            units = decode_units(self.files.read(base, skip * UNIT_SIZE, length))
            empty = np.flatnonzero(units["size"] == 0)
            if not started:
                filled = np.flatnonzero(units["size"] != 0)
                if not len(filled):
                    continue
                started = True
                self.min_offset = at + int(filled[0])
                empty = empty[empty > filled[0]]
            elif at != self.max_offset:
                break  # a missing file: the run ended at the previous file
            if len(empty):
                self.max_offset = at + int(empty[0])
                break
            self.max_offset = at + len(units)
            if skip + len(units) < self.units_per_file:
                break  # a short file ends the run
        if not started:
            self.min_offset = self.max_offset = 0
        self.truncate_to(self.max_offset)
        # What was read rather than vouched for may be in the page cache only
        # (written by a process that crashed before syncing it), names
        # included: the next checkpoint syncs it before it claims it.
        self.files.distrust_from(scan_from)

    def _prefix_intact(self, trusted_next: int) -> bool:
        """Whether the files holding slots below `trusted_next` form one run
        from the first file (leading ones may have gone to retention) up to
        the one holding slot trusted_next - 1, each at least as long as its
        slots below trusted_next: what fsynced files the checkpoint saw look
        like. A torn or lost file shows in its length or absence."""
        expected: int | None = None
        for base in self.files.bases:
            if base >= trusted_next:
                break
            if expected is not None and base != expected:
                return False
            if self.files.lengths[base] < min(self.units_per_file, trusted_next - base) * UNIT_SIZE:
                return False
            expected = base + self.units_per_file
        return expected is None or expected >= trusted_next

    def _first_filled_below(self, trusted_next: int) -> int | None:
        """The first filled slot below `trusted_next` in an intact prefix
        (empty slots there are only leading ones), or None when every slot
        below it is empty."""
        if not self.files.bases or self.files.bases[0] >= trusted_next:
            return None
        lo, hi = self.files.bases[0], trusted_next - 1
        if not self._filled(hi):
            return None
        if self._filled(lo):
            return lo  # the usual case: the queue starts at its first file's start
        while lo < hi:
            mid = (lo + hi) // 2
            if self._filled(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _filled(self, offset: int) -> bool:
        """Whether the slot at `offset` holds a unit (one 20-byte read)."""
        base = self.files.base_of(offset)
        unit = decode_units(self.files.read(base, (offset - base) * UNIT_SIZE, UNIT_SIZE))
        return bool(len(unit)) and int(unit["size"][0]) != 0

    def append(self, units: list[tuple[int, int, int]]) -> None:
        """Append units (physical offset, size, tag hash) at max_offset."""
        self.append_encoded(encode_units(units), len(units))

    def append_encoded(self, raw: bytes, count: int) -> None:
        """Append `count` units already encoded back to back (UNIT_DTYPE bytes)."""
        offset = self.max_offset
        start = 0
        while start < count:
            base = self.files.base_of(offset)
            take = min(count - start, base + self.units_per_file - offset)
            piece = raw if take == count else raw[start * UNIT_SIZE : (start + take) * UNIT_SIZE]
            self.files.write(base, (offset - base) * UNIT_SIZE, piece)
            offset += take
            start += take
        self.max_offset = offset

    def rewrite(self, start: int, raw: bytes, count: int) -> None:
        """Durably replace the whole queue by `count` encoded units from slot
        `start` (the slots before it empty), e.g. a rebuild of a damaged
        queue from the log. Every file goes, then each new one is installed
        whole and fsynced, first to last: a crash part way leaves a queue
        that ends early, which recovery sees, never a torn write whose zeros
        pass for empty leading slots."""
        self.truncate_to(0)
        sync_directory(self.directory)
        self.min_offset = self.max_offset = start
        offset, at = start, 0
        while at < count:
            base = self.files.base_of(offset)
            take = min(count - at, base + self.units_per_file - offset)
            lead = bytes((offset - base) * UNIT_SIZE)  # empty slots before `start`
            self.files.install(base, lead + raw[at * UNIT_SIZE : (at + take) * UNIT_SIZE])
            offset += take
            at += take
        self.max_offset = offset

    def start_at(self, offset: int) -> None:
        """Make an empty queue begin at `offset` (a rebuild after retention)."""
        if self.max_offset != self.min_offset:
            raise ValueError("start_at needs an empty queue")
        self.min_offset = self.max_offset = offset

    def read(self, offset: int, count: int) -> list[Unit]:
        """Up to `count` units from `offset` (clamped to [min_offset, max_offset))."""
        offset = max(offset, self.min_offset)
        stop = min(self.max_offset, offset + count)
        result: list[Unit] = []
        while offset < stop:
            base = self.files.base_of(offset)
            take = min(stop, base + self.units_per_file) - offset
            raw = self.files.read(base, (offset - base) * UNIT_SIZE, take * UNIT_SIZE)
            units = decode_units(raw)
            result += [Unit(offset + i, int(u[0]), int(u[1]), int(u[2]))
                       for i, u in enumerate(units.tolist())]
            offset += take
        return result

    def all_units(self) -> np.ndarray:
        """Every slot from 0 to max_offset (empty slots, and slots below
        min_offset, zero), as one array."""
        parts = []
        for base in self.files.bases:
            if base >= self.max_offset:
                break
            raw = self.files.read(base, 0, self.files.lengths[base])
            parts.append((base, decode_units(raw)))
        out = np.zeros(self.max_offset, dtype=parts[0][1].dtype if parts else "V20")
        for base, units in parts:
            n = min(len(units), self.max_offset - base)
            out[base : base + n] = units[:n]
        out[: self.min_offset] = np.zeros(1, dtype=out.dtype)  # below min_offset: gone
        return out

    def truncate_to(self, offset: int) -> None:
        """Drop every slot at or after `offset`."""
        self.files.truncate_from(offset)
        self.max_offset = min(self.max_offset, offset)
        self.min_offset = min(self.min_offset, self.max_offset)

    def first_offset_at_or_after(self, physical_offset: int) -> int:
        """Smallest slot whose unit points at or beyond `physical_offset`
        (units increase with the slot), or max_offset when there is none.
        Reads single units: O(1) when every unit is at or beyond it (the
        log's first position, retention aside) and O(log k) when the answer
        is k slots before the end (the tail an open cuts), so an open does
        not cost more for a longer queue."""
        lo, hi = self.min_offset, self.max_offset
        if lo == hi or self._physical(lo) >= physical_offset:
            return lo
        # Now slot lo points before it and the answer is in (lo, hi]: gallop
        # back from the end, then bisect what is left.
        step = 1
        while hi - step > lo:
            probe = hi - step
            if self._physical(probe) < physical_offset:
                lo = probe
                break
            hi = probe
            step *= 2
        lo += 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self._physical(mid) >= physical_offset:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _physical(self, offset: int) -> int:
        """The physical offset of the unit at slot `offset` (in range)."""
        return self.read(offset, 1)[0].physical_offset

    def delete_files_before(self, physical_offset: int) -> int:
        """Retention: remove files whose every unit points before
        `physical_offset`, then `correct_min_offset`; the number removed."""
        removed = 0
        for base in list(self.files.bases):
            end = base + self.units_per_file
            if end > self.max_offset:
                break
            last = self.read(end - 1, 1)
            if not last or last[0].physical_offset >= physical_offset:
                break
            self.files.remove(base)
            removed += 1
            self.min_offset = max(self.min_offset, end)
        self.correct_min_offset(physical_offset)
        return removed

    def correct_min_offset(self, physical_offset: int) -> None:
        """Raise min_offset past units that point before `physical_offset`
        (the CommitLog's first retained position): the file holding them may
        stay while the log no longer has their messages (RocketMQ's
        correctMinOffset). Derived, never written: an open recomputes it."""
        self.min_offset = self.first_offset_at_or_after(physical_offset)

    def disk_bytes(self) -> int:
        return sum(self.files.lengths.values())

    def remove_files(self) -> int:
        """Delete every file of this queue (topic deletion, a rebuild); the
        bytes freed. The queue is closed afterwards."""
        freed = self.disk_bytes()
        # Last file first: a crash part way leaves a queue that ends early,
        # which recovery sees (and rebuilds), never one whose start moved.
        for base in reversed(list(self.files.bases)):
            self.files.remove(base)
        self.files.close()
        self.min_offset = self.max_offset = 0
        return freed

    def dirty_fds(self) -> list[DirtyFile]:
        return self.files.take_dirty()

    def sync(self) -> None:
        sync_and_close(self.dirty_fds())

    def close(self) -> None:
        self.files.close()
