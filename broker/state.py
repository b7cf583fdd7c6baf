"""The broker's replicated state machine: topics, consumer offsets, queue
offsets and the idempotent-producer table, all derived from committed entries.

Plain class, no I/O: `apply(entry)` is called for every committed entry in log
order on every replica (and again over the whole log on recovery), so every
replica reaches the same state. The ConsumeQueue files are fed separately by
the broker; `queue_next` here counts the same thing (messages per queue) so a
message's queue offset is known the moment its entry is applied.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import NamedTuple

from broker.control import MAX_QUEUES, PERM_RW, decode_control
from commitlog import HEADER_SIZE, KIND_CONTROL, KIND_MESSAGES, Entry
from commitlog.message import MESSAGE_HEAD, MESSAGE_HEAD_SIZE

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class TopicConfig:
    queues: int
    perm: int = PERM_RW

    def to_wire(self) -> dict[str, int]:
        return {"queues": self.queues, "perm": self.perm}


class Stored(NamedTuple):
    """Where one message ended up (a tuple: made once per applied message)."""

    physical_offset: int
    topic: str
    queue_id: int
    queue_offset: int


class _Producer:
    """One producer's remembered sequences. `order` holds them oldest first:
    the oldest is read on every lookup, and a dict's first key is not O(1)
    once keys were deleted from its front (iteration skips the holes)."""

    __slots__ = ("high", "order", "recent")

    def __init__(self) -> None:
        self.recent: dict[int, Stored] = {}
        self.order: deque[int] = deque()
        self.high = -1  # highest sequence ever recorded


class ProducerTable:
    """Last sequences of idempotent producers and where their messages went.

    Per producer the `window` most recent sequences keep their location; at
    most `producers_max` producers are tracked (least recently written first
    out). A sequence at or below the producer's last one but no longer in the
    window is reported as an old duplicate without a location.
    """

    def __init__(self, window: int = 4096, producers_max: int = 100_000) -> None:
        self.window = window
        self.producers_max = producers_max
        self._producers: OrderedDict[int, _Producer] = OrderedDict()

    def __len__(self) -> int:
        return len(self._producers)

    def record(self, producer_id: int, sequence: int, stored: Stored) -> None:
        self.record_many(producer_id, [(sequence, stored)])

    def record_many(self, producer_id: int, items: list[tuple[int, Stored]]) -> None:
        """Remember one producer's messages of one entry (one LRU touch for all)."""
        producers = self._producers
        producer = producers.get(producer_id)
        if producer is None:
            producer = producers[producer_id] = _Producer()
            if len(producers) > self.producers_max:
                producers.popitem(last=False)
        else:
            producers.move_to_end(producer_id)
        recent, order = producer.recent, producer.order
        high = producer.high
        for sequence, stored in items:
            # A duplicate that reached the log anyway keeps the first copy.
            if sequence not in recent:
                recent[sequence] = stored
                order.append(sequence)
                if sequence > high:
                    high = sequence
        producer.high = high
        excess = len(order) - self.window
        if excess > 0:
            popleft = order.popleft
            for _ in range(excess):
                del recent[popleft()]

    def lookup(self, producer_id: int, sequence: int) -> tuple[bool, Stored | None]:
        """(already stored?, its location if still known)."""
        producer = self._producers.get(producer_id)
        if producer is None or sequence > producer.high:
            return False, None
        stored = producer.recent.get(sequence)
        if stored is not None:
            return True, stored
        order = producer.order
        if len(order) >= self.window and order and sequence < order[0]:
            return True, None
        return False, None


class BrokerState:
    """Everything the committed log says, except message bodies."""

    def __init__(self, dedup_window: int = 4096, dedup_producers_max: int = 100_000) -> None:
        self.topics: dict[str, TopicConfig] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.queue_next: dict[QueueKey, int] = {}
        self.producers = ProducerTable(dedup_window, dedup_producers_max)
        self.applied_index = 0
        self.topics_version = 0
        self.bad_control_entries = 0

    # ----------------------------------------------------------------- apply

    def apply(self, entry: Entry) -> list[Stored]:
        """Apply one committed entry; for MESSAGES, where each message went."""
        if entry.index <= self.applied_index:
            raise ValueError(f"entry {entry.index} applied twice (applied {self.applied_index})")
        self.applied_index = entry.index
        if entry.kind == KIND_MESSAGES:
            return self._apply_messages(entry)
        if entry.kind == KIND_CONTROL:
            self._apply_control(entry)
        return []

    def _apply_messages(self, entry: Entry) -> list[Stored]:
        # The hot loop of every replica (and of recovery): iter_records inlined.
        body = entry.body
        base = entry.position + HEADER_SIZE
        result: list[Stored] = []
        append = result.append
        queue_next = self.queue_next
        by_producer: dict[int, list[tuple[int, Stored]]] = {}
        names: dict[bytes, str] = {}
        unpack = MESSAGE_HEAD.unpack_from
        offset = 0
        end = len(body)
        while offset < end:
            if end - offset < MESSAGE_HEAD_SIZE:
                raise ValueError(f"truncated message head at body offset {offset}")
            fields = unpack(body, offset)
            size = fields[0]
            if (size != MESSAGE_HEAD_SIZE + fields[9] + fields[10] + fields[11] + fields[12]
                    + fields[13] + fields[14] or offset + size > end):
                raise ValueError(f"message size {size} inconsistent at body offset {offset}")
            p = offset + MESSAGE_HEAD_SIZE
            raw = body[p : p + fields[9]]
            topic = names.get(raw)
            if topic is None:
                topic = names[raw] = raw.decode()
            queue_id = fields[1]
            key = (topic, queue_id)
            queue_offset = queue_next.get(key, 0)
            queue_next[key] = queue_offset + 1
            stored = Stored(base + offset, topic, queue_id, queue_offset)
            append(stored)
            producer_id = fields[6]
            if producer_id:
                items = by_producer.get(producer_id)
                if items is None:
                    items = by_producer[producer_id] = []
                items.append((fields[7], stored))
            offset += size
        for producer_id, items in by_producer.items():
            self.producers.record_many(producer_id, items)
        return result

    def _apply_control(self, entry: Entry) -> None:
        try:
            ops = decode_control(entry.body)
        except ValueError as exc:
            # Stored and committed: every replica skips it the same way.
            self.bad_control_entries += 1
            log.warning("entry %d: %s", entry.index, exc)
            return
        for op in ops:
            kind = op.get("op")
            if kind == "topic.put":
                self._put_topic(op)
            elif kind == "topic.delete":
                if self.topics.pop(str(op.get("topic")), None) is not None:
                    self.topics_version += 1
            elif kind == "offsets.commit":
                self._commit_offsets(op.get("offsets"))
            elif kind == "offsets.reset":
                self._commit_offsets(op.get("offsets"), reset=True)

    def _put_topic(self, op: dict) -> None:
        topic, queues, perm = op.get("topic"), op.get("queues"), op.get("perm", PERM_RW)
        if (isinstance(topic, str) and isinstance(queues, int) and 1 <= queues <= MAX_QUEUES
                and isinstance(perm, int) and not perm & ~PERM_RW):
            self.topics[topic] = TopicConfig(queues, perm)
            self.topics_version += 1

    def _commit_offsets(self, offsets: object, reset: bool = False) -> None:
        if not isinstance(offsets, list):
            return
        for item in offsets:
            if not (isinstance(item, list) and len(item) == 4):
                continue
            group, topic, queue_id, offset = item
            key = (group, topic, queue_id)
            # Offsets only move forward: a consumer that lost its queue in a
            # rebalance and commits late cannot rewind the one that took over.
            # An admin reset (`offsets.reset`) is the one way back.
            if isinstance(offset, int) and offset >= 0 and (
                    reset or offset > self.offsets.get(key, -1)):
                self.offsets[key] = offset

    # ----------------------------------------------------------------- reads

    def offset_of(self, group: str, topic: str, queue_id: int) -> int:
        """The committed consumer offset, -1 if the group never committed one."""
        return self.offsets.get((group, topic, queue_id), -1)
