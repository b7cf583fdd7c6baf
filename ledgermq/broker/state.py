"""The broker's replicated state machine: topics, consumer offsets, queue
offsets, the idempotent-producer table and the ACL users, all derived from
committed entries.

Plain class, no I/O: `apply(entry)` is called for every committed entry in log
order on every replica (and again over the whole log on recovery), so every
replica reaches the same state. The ConsumeQueue files are fed separately by
the broker; `queue_next` here counts the same thing (messages per queue) so a
message's queue offset is known the moment its entry is applied.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple, cast, overload

import numpy as np

from commitlog import HEADER_SIZE, KIND_CONTROL, KIND_MESSAGES, Entry
from commitlog.columns import RecordColumns, queue_groups, scan_body
from ledgermq.broker.acl import Acl, AclError, User, parse_grants
from ledgermq.broker.control import MAX_QUEUES, PERM_RW, decode_control

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


class AppliedRecords(Sequence[Stored]):
    """Where the messages of one applied entry went (records lo..hi-1), kept
    as columns: a `Stored` is made only for the records someone asks about
    (a reply needs a few, a duplicate lookup one)."""

    __slots__ = ("base", "hi", "lo", "queue_ids", "queue_offsets", "starts", "topic_ids",
                 "topics")

    def __init__(self, base: int, starts: np.ndarray, topics: list[str],
                 topic_ids: np.ndarray, queue_ids: np.ndarray, queue_offsets: np.ndarray,
                 lo: int, hi: int) -> None:
        self.base, self.starts, self.topics, self.topic_ids = base, starts, topics, topic_ids
        self.queue_ids, self.queue_offsets, self.lo, self.hi = queue_ids, queue_offsets, lo, hi

    def __len__(self) -> int:
        return self.hi - self.lo

    def stored(self, record: int) -> Stored:
        """The record'th record of the whole entry (ignoring lo)."""
        return Stored(self.base + int(self.starts[record]),
                      self.topics[int(self.topic_ids[record])],
                      int(self.queue_ids[record]), int(self.queue_offsets[record]))

    @overload
    def __getitem__(self, k: int) -> Stored: ...

    @overload
    def __getitem__(self, k: slice) -> AppliedRecords: ...

    def __getitem__(self, k: int | slice) -> Stored | AppliedRecords:
        if isinstance(k, slice):
            lo, hi, step = k.indices(len(self))
            if step != 1:
                raise ValueError("AppliedRecords slices have step 1")
            return AppliedRecords(self.base, self.starts, self.topics, self.topic_ids,
                                  self.queue_ids, self.queue_offsets, self.lo + lo,
                                  self.lo + max(lo, hi))
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(k)
        return self.stored(self.lo + k)


class _Producer:
    """One producer's remembered sequences. `order` holds them oldest first:
    the oldest is read on every lookup, and a dict's first key is not O(1)
    once keys were deleted from its front (iteration skips the holes)."""

    __slots__ = ("high", "order", "recent")

    def __init__(self) -> None:
        # sequence -> Stored, or (AppliedRecords, record) made into one on lookup
        self.recent: dict[int, Stored | tuple[AppliedRecords, int]] = {}
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
            producer = self._touch(producer_id)
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
        self._evict(producer)

    def record_applied(self, producer_id: int, sequences: np.ndarray, applied: AppliedRecords,
                       members: np.ndarray | None) -> None:
        """Remember one producer's messages of one applied entry: `sequences`
        of its records `members` (None: every record of the entry)."""
        seqs = sequences.tolist()
        records = range(len(seqs)) if members is None else members.tolist()
        producer = self._producers.get(producer_id)
        if (producer is None or seqs[0] > producer.high) and (
                len(seqs) == 1 or bool((sequences[1:] > sequences[:-1]).all())):
            # New and increasing (the normal case): no per-record checks.
            if producer is None:
                producer = self._touch(producer_id)
            else:
                self._producers.move_to_end(producer_id)
            producer.recent.update(zip(seqs, zip(repeat(applied), records, strict=False),
                                       strict=True))
            producer.order.extend(seqs)
            producer.high = seqs[-1]
            self._evict(producer)
            return
        self.record_many(producer_id, [(seq, (applied, k))  # type: ignore[misc]
                                       for seq, k in zip(seqs, records, strict=True)])

    def _touch(self, producer_id: int) -> _Producer:
        producers = self._producers
        producer = producers[producer_id] = _Producer()
        if len(producers) > self.producers_max:
            producers.popitem(last=False)
        return producer

    def _evict(self, producer: _Producer) -> None:
        order, recent = producer.order, producer.recent
        excess = len(order) - self.window
        if excess > 0:
            popleft = order.popleft
            for _ in range(excess):
                del recent[popleft()]

    def high(self, producer_id: int) -> int:
        """The producer's highest recorded sequence; -1 if none is known."""
        producer = self._producers.get(producer_id)
        return -1 if producer is None else producer.high

    def lookup(self, producer_id: int, sequence: int) -> tuple[bool, Stored | None]:
        """(already stored?, its location if still known)."""
        producer = self._producers.get(producer_id)
        if producer is None or sequence > producer.high:
            return False, None
        stored = producer.recent.get(sequence)
        if stored is not None:
            # A plain tuple is (applied entry, record number); a Stored (a
            # NamedTuple) is already resolved. The type test is the fast one.
            if type(stored) is tuple:
                applied, record = cast(tuple[AppliedRecords, int], stored)
                return True, applied.stored(record)
            return True, cast(Stored, stored)
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
        self.acl = Acl()
        # ACL operations skipped as invalid (the handlers validate first, so
        # only a newer or broken proposer gets one into the log).
        self.bad_acl_ops = 0

    # ----------------------------------------------------------------- apply

    def apply(self, entry: Entry, columns: RecordColumns | None = None) -> Sequence[Stored]:
        """Apply one committed entry; for MESSAGES, where each message went.
        `columns`: the entry body's `scan_body`, when the caller has it."""
        if entry.index <= self.applied_index:
            raise ValueError(f"entry {entry.index} applied twice (applied {self.applied_index})")
        self.applied_index = entry.index
        if entry.kind == KIND_MESSAGES:
            return self._apply_messages(entry, columns)
        if entry.kind == KIND_CONTROL:
            self._apply_control(entry)
        return []

    def _apply_messages(self, entry: Entry, columns: RecordColumns | None) -> AppliedRecords:
        # The hot path of every replica (and of recovery): whole columns per
        # queue and per producer, no Python object per record.
        if columns is None:
            columns = scan_body(entry.body)
        n = len(columns)
        queue_next = self.queue_next
        groups = queue_groups(columns)
        if len(groups) == 1 and groups[0][1] is None:
            key = groups[0][0]
            start = queue_next.get(key, 0)
            queue_next[key] = start + n
            queue_offsets = np.arange(start, start + n, dtype=np.int64)
        elif n > 128:
            queue_offsets = np.empty(n, dtype=np.int64)
            for key, members in groups:
                start = queue_next.get(key, 0)
                queue_next[key] = start + len(members)  # type: ignore[arg-type]
                queue_offsets[members] = np.arange(start, start + len(members))  # type: ignore[arg-type]
        else:
            offsets = [0] * n
            for key, members in groups:
                start = queue_next.get(key, 0)
                queue_next[key] = start + len(members)  # type: ignore[arg-type]
                for k, record in enumerate(members):  # type: ignore[arg-type]
                    offsets[record] = start + k
            queue_offsets = np.array(offsets, dtype=np.int64)
        applied = AppliedRecords(entry.position + HEADER_SIZE, columns.starts, columns.topics,
                                 columns.topic_ids, columns.heads["queue_id"], queue_offsets,
                                 0, n)
        producer_ids = columns.heads["producer_id"]
        first = int(producer_ids[0]) if n else 0
        if n <= 1 or (producer_ids == first).all():
            if first:
                self.producers.record_applied(first, columns.heads["sequence"], applied, None)
        else:
            for producer_id in np.unique(producer_ids).tolist():
                if producer_id:
                    own = np.flatnonzero(producer_ids == producer_id)
                    self.producers.record_applied(
                        producer_id, columns.heads["sequence"][own], applied, own)
        return applied

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
            elif isinstance(kind, str) and kind.startswith("acl."):
                try:
                    self._apply_acl(kind, op)
                except AclError as exc:
                    # Every replica skips it the same way: the check is pure.
                    self.bad_acl_ops += 1
                    log.warning("entry %d: %s skipped: %s", entry.index, kind, exc)

    def _apply_acl(self, kind: str, op: dict[str, Any]) -> None:
        acl = self.acl
        if kind == "acl.user.put":
            record = op.get("user")
            key = record.get("access_key") if isinstance(record, dict) else None
            known = acl.users.get(key) if isinstance(key, str) else None
            acl.put(User.from_record(record, secret=known.secret if known else None))
            return
        key = op.get("access_key")
        if not isinstance(key, str):
            raise AclError("no access key")
        if kind == "acl.user.delete":
            acl.delete(key)
        elif kind == "acl.grant":
            topics = parse_grants(op.get("topics"), group=False)
            groups = parse_grants(op.get("groups"), group=True)
            if not acl.grant(key, topics, groups):
                raise AclError(f"no user {key!r}")
        elif kind == "acl.revoke":
            names, group_names = op.get("topics") or [], op.get("groups") or []
            if not (isinstance(names, list) and isinstance(group_names, list)
                    and all(isinstance(n, str) for n in [*names, *group_names])):
                raise AclError("revoked names must be lists of names")
            if not acl.revoke(key, names, group_names):
                raise AclError(f"no user {key!r}")

    def _put_topic(self, op: dict[str, Any]) -> None:
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
