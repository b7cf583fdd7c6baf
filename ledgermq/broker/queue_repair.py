"""Checking the ConsumeQueue units a read uses, and refilling a damaged queue
from the CommitLog while the broker runs.

Queue files carry no checksum (as in RocketMQ): a flipped bit in a unit
points a read at the wrong bytes. Each unit a pull uses is therefore checked
against the record it leads to (`check_read`): the record decodes whole at
the unit's size, belongs to the unit's topic and queue, has the unit's tag
hash, and the queue's records go forward in the log. A unit that fails is
damage, never a reason to serve some other message (of another topic, past
the ACL) or to fail the consumer forever. `QueueRepairs.repair` then rebuilds
that one queue from the log: it scans the committed entries for the queue's
units in steps (the loop runs between them), and replaces the slots it
scanned for, numbered so that the queue's end stays where dispatch put it
(what the replicated counts say). Slots dispatched during the scan are kept.
One repair per queue at a time; readers that hit the same damage wait for it.

What this cannot see: a tag hash flipped on a unit that a tag filter then
skips is never read, so it is not checked here (the nightly audit compares
every unit with the log, docs/audit.md).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable, Sequence

from commitlog import CommitLog, StoredMessage, decode_message_at, tag_hash
from commitlog.errors import StorageError
from consumequeue import ConsumeQueueStore, Unit
from ledgermq.base.errors import ServiceUnavailableError
from ledgermq.base.message_record import MESSAGE_HEAD_SIZE

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


class DamagedUnitError(Exception):
    """A unit does not lead to a record of its queue."""

    def __init__(self, key: QueueKey, unit: Unit, why: str) -> None:
        super().__init__(f"ConsumeQueue {key[0]}/{key[1]} unit at offset {unit.queue_offset}"
                         f" (log position {unit.physical_offset}, {unit.size} bytes): {why}")
        self.key = key
        self.unit = unit


def check_read(key: QueueKey, units: Sequence[Unit],
               read: Callable[[Sequence[Unit]], list[StoredMessage]],
               max_size: int) -> list[StoredMessage]:
    """`read(units)`, each record checked against its unit; DamagedUnitError
    names the first unit that does not lead to a record of `key`. A size
    outside [record head, `max_size`] is refused before anything is read (a
    flipped high bit would have the read take a whole segment)."""
    previous = -1
    for unit in units:
        if unit.physical_offset <= previous:
            raise DamagedUnitError(key, unit, f"goes back in the log from position {previous}")
        if not MESSAGE_HEAD_SIZE <= unit.size <= max_size:
            raise DamagedUnitError(key, unit, f"a record cannot be {unit.size} bytes")
        previous = unit.physical_offset
    try:
        stored = read(units)
    except (StorageError, ValueError, UnicodeDecodeError, struct.error, IndexError) as error:
        # Which unit failed is not known here: the first is as good a name
        # as any, the repair rebuilds the whole queue.
        raise DamagedUnitError(key, units[0], f"its bytes do not decode: {error}") from None
    topic, queue_id = key
    for unit, sm in zip(units, stored, strict=True):
        message = sm.message
        if message.topic != topic or message.queue_id != queue_id:
            raise DamagedUnitError(key, unit, f"the record there is of queue "
                                              f"{message.topic}/{message.queue_id}")
        if sm.size != unit.size or tag_hash(message.tags) != unit.tag_hash:
            raise DamagedUnitError(key, unit, "the record's size or tag hash differs")
    return stored


def read_message_run(log_: CommitLog, units: Sequence[Unit], run_bytes: int = 1 << 20
                     ) -> list[StoredMessage]:
    """Decode the messages of `units`, reading records that lie near each
    other in the same segment with one call."""
    segment = log_.config.segment_size_bytes
    out: list[StoredMessage] = []
    i = 0
    while i < len(units):
        start = units[i].physical_offset
        j = i + 1
        while (j < len(units) and units[j].physical_offset >= start
               and units[j].physical_offset + units[j].size - start <= run_bytes
               and units[j].physical_offset // segment == start // segment):
            j += 1
        end = max(u.physical_offset + u.size for u in units[i:j])
        raw = log_.read_bytes(start, end - start)
        for u in units[i:j]:
            at = u.physical_offset - start
            if at + u.size > len(raw):
                out.append(log_.read_message(u.physical_offset, u.size))
            else:
                out.append(decode_message_at(raw[at : at + u.size], u.physical_offset))
        i = j
    return out


class QueueRepairs:
    """Rebuilds of single queues from the log, one at a time per queue, and
    none of a queue within `pause_s` of its last one: damage the rebuild did
    not cure (the log itself, a bug) is answered at once instead of costing
    a scan of the log per pull."""

    def __init__(self, pause_s: float = 10.0) -> None:
        self._running: dict[QueueKey, asyncio.Task[None]] = {}
        self._last: dict[QueueKey, float] = {}  # monotonic end of the last rebuild
        self.pause_s = pause_s
        self.repaired = 0
        self.failed = 0

    async def repair(self, cq: ConsumeQueueStore, damage: DamagedUnitError) -> None:
        """Rebuild `damage.key`'s queue from the log (or wait for the rebuild
        under way). ServiceUnavailableError when it could not be done now."""
        key = damage.key
        task = self._running.get(key)
        if task is None:
            last = self._last.get(key)
            if last is not None and time.monotonic() - last < self.pause_s:
                raise ServiceUnavailableError(
                    f"{damage}; the queue was rebuilt from the log {time.monotonic() - last:.1f}"
                    f" s ago and is still damaged; retry later, or restart the node")
            log.error("%s; rebuilding the queue from the CommitLog", damage)
            task = asyncio.ensure_future(self._rebuild(cq, key))
            self._running[key] = task
            task.add_done_callback(lambda _t: self._done(key))
        try:
            await asyncio.shield(task)
        except (StorageError, ValueError) as error:
            raise ServiceUnavailableError(
                f"ConsumeQueue {key[0]}/{key[1]} is damaged and its rebuild from the log"
                f" failed ({error}); retry, or restart the node to rebuild it") from None

    def _done(self, key: QueueKey) -> None:
        self._running.pop(key, None)
        self._last[key] = time.monotonic()

    async def _rebuild(self, cq: ConsumeQueueStore, key: QueueKey) -> None:
        try:
            await self._scan_and_replace(cq, key)
        except BaseException:
            self.failed += 1
            raise
        self.repaired += 1

    @staticmethod
    async def _scan_and_replace(cq: ConsumeQueueStore, key: QueueKey) -> None:
        log_ = cq.log
        upto_index = cq.dispatched_index
        upto = cq.offsets(*key)[1]  # the queue's end for entries up to upto_index
        generation = cq.generation
        parts: list[bytes] = []
        count = 0
        index = log_.first_index
        while index <= upto_index:
            raw, n, index = cq.units_in_log(key, index, upto_index)
            parts.append(raw)
            count += n
            await asyncio.sleep(0)  # a long log must not stall the Raft loop
        if cq.generation != generation or cq.get(*key) is None:
            # A topic deletion or an install changed the queues meanwhile.
            raise ValueError("the queues were rebuilt or removed during the scan")
        first = upto - count
        if first < 0:
            raise ValueError(f"the log holds {count} messages of the queue, more than"
                             f" its end {upto}")
        cq.replace_queue(key, first, b"".join(parts), count, upto)
        log.warning("ConsumeQueue %s/%d rebuilt from the CommitLog: %d units from offset %d",
                    key[0], key[1], count, first)
