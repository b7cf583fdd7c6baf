"""The broker's replicated state machine: topics, consumer offsets, queue
offsets, the idempotent-producer table, the ACL users, the agreed retention
point and the topic deletions, all derived from committed entries.

Plain class, no I/O: `apply(entry)` is called for every committed entry in log
order on every replica (and on recovery, for the entries after the snapshot it
starts from), so every replica reaches the same state. The ConsumeQueue files
are fed separately by the broker; `queue_next` here counts the same thing
(messages per queue) so a message's queue offset is known the moment its entry
is applied.

`to_snapshot()` / `from_snapshot()` serialise the whole state at its applied
index (zstd-compressed msgpack, versioned: docs/storage-format.md, "Broker
state snapshot"); `capture()` takes the copy on the owner's thread so the
encoding can run on another.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise, repeat
from operator import itemgetter
from typing import Any, NamedTuple, cast, overload

import msgpack
import numpy as np
import zstandard

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


# One applied entry's columns as the producers' dedup windows hold them: a
# numpy object array of (base position, record starts, topics, topic ids,
# queue ids, queue offsets). The cyclic collector never tracks a numpy
# array, so a (columns, record) pair holds nothing it tracks and is
# untracked at its first collection. A few producers' windows are tens of
# thousands of pairs; while they held the AppliedRecords itself, each full
# collection walked them all (6-10 ms pauses of the loop, docs/broker.md
# "Snapshots and full collections off the tail"). A tuple would do only
# once the collector had untracked it, which depends on the order it meets
# the objects in. The columns hold no reference back: no cycle can form.
EntryColumns = np.ndarray
# Where a remembered message went: resolved, or (its entry's columns, record).
Location = Stored | tuple[EntryColumns, int]


def entry_columns(base: int, starts: np.ndarray, topics: Sequence[str], topic_ids: np.ndarray,
                  queue_ids: np.ndarray, queue_offsets: np.ndarray) -> EntryColumns:
    """The columns of one applied entry, as the dedup windows hold them."""
    columns = np.empty(6, dtype=object)
    # One element at a time: assigning the arrays as a slice would broadcast them.
    columns[0], columns[1], columns[2] = base, starts, tuple(topics)
    columns[3], columns[4], columns[5] = topic_ids, queue_ids, queue_offsets
    return columns


def stored_at(columns: EntryColumns, record: int) -> Stored:
    """The location of record `record` of the entry `columns` describes."""
    base, starts, topics, topic_ids, queue_ids, queue_offsets = columns
    return Stored(base + int(starts[record]), topics[int(topic_ids[record])],
                  int(queue_ids[record]), int(queue_offsets[record]))


class AppliedRecords(Sequence[Stored]):
    """Where the messages of one applied entry went (records lo..hi-1), kept
    as columns: a `Stored` is made only for the records someone asks about
    (a reply needs a few, a duplicate lookup one)."""

    __slots__ = ("base", "columns", "hi", "lo", "queue_ids", "queue_offsets", "starts",
                 "topic_ids", "topics")

    def __init__(self, base: int, starts: np.ndarray, topics: list[str],
                 topic_ids: np.ndarray, queue_ids: np.ndarray, queue_offsets: np.ndarray,
                 lo: int, hi: int) -> None:
        self.base, self.starts, self.topics, self.topic_ids = base, starts, topics, topic_ids
        self.queue_ids, self.queue_offsets, self.lo, self.hi = queue_ids, queue_offsets, lo, hi
        self.columns = entry_columns(base, starts, topics, topic_ids, queue_ids, queue_offsets)

    def __len__(self) -> int:
        return self.hi - self.lo

    def stored(self, record: int) -> Stored:
        """The record'th record of the whole entry (ignoring lo)."""
        return stored_at(self.columns, record)

    def queue_offset(self, record: int) -> int:
        """`stored(record).queue_offset`, without the rest (a send's answer)."""
        return int(self.queue_offsets[record])

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
        # sequence -> Stored, or (entry columns, record) made into one on lookup
        self.recent: dict[int, Location] = {}
        self.order: deque[int] = deque()
        self.high = -1  # highest sequence ever recorded


# (producer id, highest sequence, remembered sequences oldest first, where each went)
ProducerCapture = tuple[int, int, list[int], list[Location]]


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

    def record_applied(self, producer_id: int, sequences: np.ndarray | list[int],
                       applied: AppliedRecords, members: np.ndarray | list[int] | None) -> None:
        """Remember one producer's messages of one applied entry: `sequences`
        of its records `members` (None: every record of the entry); numpy
        columns or, for a few records, lists."""
        if isinstance(sequences, list):
            seqs = sequences
            increasing = all(b > a for a, b in pairwise(seqs))
        else:
            seqs = sequences.tolist()
            increasing = len(seqs) == 1 or bool((sequences[1:] > sequences[:-1]).all())
        if members is None:
            records: range | list[int] = range(len(seqs))
        else:
            records = members if isinstance(members, list) else members.tolist()
        producer = self._producers.get(producer_id)
        if (producer is None or seqs[0] > producer.high) and increasing:
            # New and increasing (the normal case): no per-record checks.
            if producer is None:
                producer = self._touch(producer_id)
            else:
                self._producers.move_to_end(producer_id)
            producer.recent.update(zip(seqs, zip(repeat(applied.columns), records,
                                                 strict=False), strict=True))
            producer.order.extend(seqs)
            producer.high = seqs[-1]
            self._evict(producer)
            return
        columns = applied.columns
        self.record_many(producer_id, [(seq, (columns, k))  # type: ignore[misc]
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

    def capture(self) -> list[ProducerCapture]:
        """(producer id, high, sequences oldest first, their locations) per
        producer, least recently written first: a copy the table's later
        changes do not touch (the locations themselves are immutable)."""
        return [(pid, p.high, list(p.order), list(map(p.recent.__getitem__, p.order)))
                for pid, p in self._producers.items()]

    def restore(self, producers: list[tuple[int, int, list[tuple[int, Location]]]]) -> None:
        """Replace the table's content with (producer id, high, [(sequence,
        location)] oldest first) per producer, least recently written first
        (what `capture` took, resolved). This table's own bounds apply."""
        self._producers.clear()
        for producer_id, high, items in producers:
            producer = self._touch(producer_id)
            producer.recent.update(items)
            producer.order.extend(seq for seq, _ in items)
            producer.high = high
            self._evict(producer)

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
            # A plain tuple is (entry columns, record number); a Stored (a
            # NamedTuple) is already resolved. The type test is the fast one.
            if type(stored) is tuple:
                columns, record = cast(tuple[EntryColumns, int], stored)
                return True, stored_at(columns, record)
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
        # The agreed retention point (`log.trim`): a CommitLog position every
        # replica may delete whole segments below (bounded locally by its own
        # snapshot and ConsumeQueue checkpoint).
        self.trim = 0
        # topic -> index of the entry that deleted it: messages of the topic in
        # entries below that index are dead (never indexed again, never served).
        self.deleted_before: dict[str, int] = {}
        # Topics deleted since the owner last asked (`take_deleted`): the
        # broker drops their ConsumeQueue files.
        self._deleted_pending: list[str] = []

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
        if columns.rows is not None:
            return self._apply_few(entry, columns, columns.rows)
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

    def _apply_few(self, entry: Entry, columns: RecordColumns,
                   rows: list[tuple[int, ...]]) -> AppliedRecords:
        """`_apply_messages` of a body of a few records (one, for a producer
        sending one message at a time), from the heads as Python tuples: the
        same state, without the numpy reductions whose fixed cost per call
        outweighs a handful of records."""
        n = len(rows)
        queue_next = self.queue_next
        offsets = [0] * n
        for key, members in queue_groups(columns):
            start = queue_next.get(key, 0)
            if members is None:
                queue_next[key] = start + n
                offsets = list(range(start, start + n))
                break
            queue_next[key] = start + len(members)
            for k, record in enumerate(members):
                offsets[record] = start + k
        applied = AppliedRecords(entry.position + HEADER_SIZE, columns.starts, columns.topics,
                                 columns.topic_ids, columns.heads["queue_id"],
                                 np.array(offsets, dtype=np.int64), 0, n)
        first = rows[0][6]
        if all(row[6] == first for row in rows):
            if first:
                self.producers.record_applied(first, [row[7] for row in rows], applied, None)
            return applied
        own: dict[int, list[int]] = {}
        for k, row in enumerate(rows):
            if row[6]:
                own.setdefault(row[6], []).append(k)
        for producer_id in sorted(own):  # as np.unique orders them
            members = own[producer_id]
            self.producers.record_applied(producer_id, [rows[k][7] for k in members], applied,
                                          members)
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
                topic = op.get("topic")
                if isinstance(topic, str):
                    self._delete_topic(topic, entry.index)
            elif kind == "log.trim":
                position = op.get("position")
                if isinstance(position, int) and not isinstance(position, bool) and position >= 0:
                    self.trim = max(self.trim, position)
                else:
                    log.warning("entry %d: log.trim with position %r skipped", entry.index,
                                position)
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

    def _delete_topic(self, topic: str, index: int) -> None:
        """Everything the state knows of `topic` goes: its configuration, its
        queue counters (a re-created topic counts from 0 again) and the
        consumer offsets in it. Its messages in entries below `index` are dead
        (`deleted_before`): the ConsumeQueues skip them, now and in every
        rebuild from the log."""
        if self.topics.pop(topic, None) is not None:
            self.topics_version += 1
        for key in [k for k in self.queue_next if k[0] == topic]:
            del self.queue_next[key]
        for group_key in [k for k in self.offsets if k[1] == topic]:
            del self.offsets[group_key]
        self.deleted_before[topic] = index
        self._deleted_pending.append(topic)

    def take_deleted(self) -> list[str]:
        """Topics deleted by the entries applied since the last call."""
        deleted, self._deleted_pending = self._deleted_pending, []
        return deleted

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

    # ------------------------------------------------------------- snapshots

    def capture(self) -> StateCapture:
        """A copy of the state at `applied_index`, cheap enough for the owner's
        thread; `StateCapture.encode()` (the costly part) may run on another."""
        return StateCapture(
            self.applied_index, self.topics_version, self.trim, self.bad_control_entries,
            self.bad_acl_ops, dict(self.topics), dict(self.offsets), dict(self.queue_next),
            dict(self.deleted_before), dict(self.acl.users), self.producers.capture())

    def to_snapshot(self) -> bytes:
        """The whole state, serialised (see `from_snapshot`)."""
        return self.capture().encode()

    @classmethod
    def from_snapshot(cls, data: bytes, dedup_window: int = 4096,
                      dedup_producers_max: int = 100_000) -> BrokerState:
        """The state `to_snapshot` serialised; SnapshotFormatError if `data`
        is not a snapshot of a version this code reads."""
        try:
            doc = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(data), raw=False,
                                  strict_map_key=False)
        except Exception as exc:  # zstd and msgpack each have their own errors
            raise SnapshotFormatError(f"not a broker state snapshot: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
            raise SnapshotFormatError("not a broker state snapshot (no format marker)")
        if doc.get("v") != SNAPSHOT_VERSION:
            raise SnapshotFormatError(
                f"broker state snapshot version {doc.get('v')!r}; this broker reads"
                f" {SNAPSHOT_VERSION}")
        state = cls(dedup_window, dedup_producers_max)
        try:
            state._restore(doc)
        except (KeyError, TypeError, ValueError, AclError) as exc:
            raise SnapshotFormatError(f"broker state snapshot is malformed: {exc!r}") from None
        return state

    def _restore(self, doc: dict[str, Any]) -> None:
        self.applied_index = int(doc["applied_index"])
        self.topics_version = int(doc["topics_version"])
        self.trim = int(doc["trim"])
        self.bad_control_entries = int(doc["bad_control_entries"])
        self.bad_acl_ops = int(doc["bad_acl_ops"])
        self.topics = {name: TopicConfig(queues, perm) for name, queues, perm in doc["topics"]}
        self.offsets = {(g, t, q): o for g, t, q, o in doc["offsets"]}
        self.queue_next = {(t, q): n for t, q, n in doc["queue_next"]}
        self.deleted_before = {t: i for t, i in doc["deleted_before"]}
        for record in doc["acl_users"]:
            self.acl.put(User.from_record(record))
        names = doc["producer_topics"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("producer_topics is not a list of names")
        producers: list[tuple[int, int, list[tuple[int, Location]]]] = []
        for pid, high, seqs, phys, tids, qids, qoffs in doc["producers"]:
            sequences = np.frombuffer(seqs, _I8).tolist()
            n = len(sequences)
            topic_ids = np.frombuffer(tids, _I4)
            rest = (np.frombuffer(phys, _I8), topic_ids, np.frombuffer(qids, _I4),
                    np.frombuffer(qoffs, _I8))
            if any(len(column) != n for column in rest):
                raise ValueError(f"producer {pid}: {n} sequences but columns of other lengths")
            if n and not 0 <= int(topic_ids.min()) <= int(topic_ids.max()) < len(names):
                raise ValueError(f"producer {pid}: a topic number outside producer_topics")
            # The window as the columns of one entry (its locations as they
            # were encoded): no object per message, and nothing the cyclic
            # collector walks (see `EntryColumns`).
            columns = entry_columns(0, rest[0], names, *rest[1:])
            window: list[tuple[int, Location]] = list(
                zip(sequences, zip(repeat(columns), range(n)), strict=True))
            producers.append((pid, high, window))
        self.producers.restore(producers)


SNAPSHOT_FORMAT = "ledgermq.broker.state"
SNAPSHOT_VERSION = 1
_I8, _I4 = np.dtype("<i8"), np.dtype("<i4")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_ZSTD_LEVEL = 3  # the state is small next to the log; speed over ratio


class SnapshotFormatError(ValueError):
    """Bytes that are not a broker state snapshot this code can read."""


@dataclass(frozen=True)
class StateCapture:
    """The broker state at one applied index, copied (`BrokerState.capture`).
    Shares nothing that the state mutates afterwards, so `encode` may run on
    another thread while the state moves on."""

    applied_index: int
    topics_version: int
    trim: int
    bad_control_entries: int
    bad_acl_ops: int
    topics: dict[str, TopicConfig]
    offsets: dict[tuple[str, str, int], int]
    queue_next: dict[QueueKey, int]
    deleted_before: dict[str, int]
    users: dict[str, User]
    producers: list[ProducerCapture]

    def encode(self) -> bytes:
        """zstd(msgpack(document)); docs/storage-format.md gives the document."""
        names: dict[str, int] = {}
        producers = [[pid, high, *_producer_columns(seqs, locations, names)]
                     for pid, high, seqs, locations in self.producers]
        doc = {
            "format": SNAPSHOT_FORMAT, "v": SNAPSHOT_VERSION,
            "applied_index": self.applied_index, "topics_version": self.topics_version,
            "trim": self.trim, "bad_control_entries": self.bad_control_entries,
            "bad_acl_ops": self.bad_acl_ops,
            "topics": [[name, c.queues, c.perm] for name, c in self.topics.items()],
            "offsets": [[g, t, q, o] for (g, t, q), o in self.offsets.items()],
            "queue_next": [[t, q, n] for (t, q), n in self.queue_next.items()],
            "deleted_before": [[t, i] for t, i in self.deleted_before.items()],
            "acl_users": [user.to_record() for user in self.users.values()],
            "producer_topics": list(names),
            "producers": producers,
        }
        packed: bytes = msgpack.packb(doc, use_bin_type=True)
        data: bytes = zstandard.ZstdCompressor(level=_ZSTD_LEVEL,
                                               write_content_size=True).compress(packed)
        return data


def _producer_columns(seqs: list[int], locations: list[Location],
                      names: dict[str, int]) -> list[bytes]:
    """One producer's remembered sequences and their locations as five
    little-endian columns (sequence, physical offset, topic number in `names`,
    queue id, queue offset). Locations still held as (entry columns, record)
    are resolved a run of one entry at a time, not record by record.

    The runs are found without a Python step per record: the encode runs on
    a thread but holds the GIL, and with a few producers' windows (4,096
    each) a loop per record took 60-100 ms, which the event loop waited
    out in switch intervals (docs/broker.md, "Snapshots and full collections
    off the tail")."""
    n = len(seqs)
    phys, qoffs = np.empty(n, _I8), np.empty(n, _I8)
    tids, qids = np.empty(n, _I4), np.empty(n, _I4)
    # A run is a stretch of locations with the same first item: one entry's
    # columns for (columns, record) pairs; a Stored's first item is an int,
    # never an entry's columns, and Stored are taken one by one.
    owners = np.fromiter(map(id, map(_FIRST, locations)), np.uint64, n)
    bounds = [0, *(np.flatnonzero(owners[1:] != owners[:-1]) + 1).tolist(), n] if n else [0]
    records_of: list[int] | None = None
    for i, j in pairwise(bounds):
        location = locations[i]
        if type(location) is tuple:
            base, starts, topics, topic_ids, queue_ids, queue_offsets = cast(
                tuple[EntryColumns, int], location)[0]
            if records_of is None:
                records_of = list(map(_SECOND, locations))
            records = np.array(records_of[i:j], np.int64)
            # Topics numbered in order of first use, as the one-by-one path
            # below does, so the same state always encodes to the same bytes.
            if len(topics) == 1:  # the usual entry: one topic
                tids[i:j] = names.setdefault(topics[0], len(names))
            else:
                ids = topic_ids[records]
                local = np.zeros(len(topics), _I4)
                used, first = np.unique(ids, return_index=True)
                for t in used[np.argsort(first)].tolist():
                    local[t] = names.setdefault(topics[t], len(names))
                tids[i:j] = local[ids]
            phys[i:j] = base + starts[records]
            qids[i:j] = queue_ids[records]
            qoffs[i:j] = queue_offsets[records]
            continue
        for k in range(i, j):
            stored = cast(Stored, locations[k])
            phys[k], qids[k], qoffs[k] = stored.physical_offset, stored.queue_id, \
                stored.queue_offset
            tids[k] = names.setdefault(stored.topic, len(names))
    return [np.array(seqs, _I8).tobytes(), phys.tobytes(), tids.tobytes(), qids.tobytes(),
            qoffs.tobytes()]
