"""One ConsumeQueue: the fixed-width index of one (topic, queue id).

A queue offset is a slot number. Files hold `units_per_file` slots and are
named by the offset of their first slot (`commitlog.file_queue` keeps them).
Leading slots may be empty (removed by retention or never held here);
everything from `min_offset` to `max_offset` is filled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commitlog.disk import DirtyFile, sync_and_close
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

    def __init__(self, directory: str, topic: str, queue_id: int, units_per_file: int) -> None:
        self.directory = directory
        self.topic = topic
        self.queue_id = queue_id
        self.units_per_file = units_per_file
        self.files = FileQueue(directory, units_per_file, unit_size=UNIT_SIZE)
        self.foreign = self.files.foreign
        self.max_offset = 0
        self.min_offset = 0
        self._trim_partial_units()
        self._find_bounds()

    def _trim_partial_units(self) -> None:
        """A crash can leave a unit half written at a file's end: drop it."""
        for base, length in list(self.files.lengths.items()):
            self.files.cut(base, length - length % UNIT_SIZE)

    def _find_bounds(self) -> None:
        """min_offset = first filled slot; max_offset = end of the contiguous
        filled run from there. Anything after a hole is cut: a crash can tear an
        earlier file while a later one survives (writeback order is arbitrary),
        and units after a hole cannot be trusted to be the next messages."""
        self.min_offset = self.max_offset = 0
        started = False
        for base in list(self.files.bases):
            units = decode_units(self.files.read(base, 0, self.files.lengths[base]))
            empty = np.flatnonzero(units["size"] == 0)
            if not started:
                filled = np.flatnonzero(units["size"] != 0)
                if not len(filled):
                    continue
                started = True
                self.min_offset = base + int(filled[0])
                empty = empty[empty > filled[0]]
            elif base != self.max_offset:
                break  # a missing file: the run ended at the previous file
            if len(empty):
                self.max_offset = base + int(empty[0])
                break
            self.max_offset = base + len(units)
            if len(units) < self.units_per_file:
                break  # a short file ends the run
        if not started:
            self.min_offset = self.max_offset = 0
        self.truncate_to(self.max_offset)

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
        (units increase with the slot), or max_offset when there is none."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            if self.read(mid, 1)[0].physical_offset >= physical_offset:
                hi = mid
            else:
                lo = mid + 1
        return lo

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
