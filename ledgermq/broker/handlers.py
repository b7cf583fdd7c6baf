"""Client request handlers of a broker node (request codes 200-399).

Each handler validates its body (INVALID_REQUEST names the field), checks
that the connection's principal may make it (the ACL, broker/acl.py, on a
broker with a cluster secret; an open broker checks nothing), checks where the
request may run (writes: the ready leader; reads: any node, which serves
committed data only) and answers with the map docs/protocol.md gives.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable
from dataclasses import dataclass
from functools import partial
from typing import Any

from commitlog import tag_hash
from commitlog.errors import MessageTooLargeError as StorageTooLarge
from commitlog.message import valid_topic
from consumequeue import Unit
from ledgermq.base.clock import monotonic_ms
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    InvalidRequestError,
    MessageTooLargeError,
    NoPermissionError,
    NotLeaderError,
    OffsetMovedError,
    OffsetOutOfRangeError,
    ServiceUnavailableError,
    UnknownTopicError,
)
from ledgermq.broker.acl import (
    AclError,
    Action,
    User,
    parse_grants,
    peer_host,
    perm_name,
    valid_access_key,
)
from ledgermq.broker.codec import (
    Records,
    Scanned,
    client_id_field,
    commit_offsets_body,
    encode_wire_message,
    group_field,
    message_id,
    message_view,
    offset_field,
    queue_id_field,
    scan_records,
    subscriptions_field,
    topic_field,
)
from ledgermq.broker.control import (
    MAX_QUEUES,
    PERM_READ,
    PERM_RW,
    PERM_WRITE,
    acl_grant,
    acl_revoke,
    acl_user_delete,
    acl_user_put,
    topic_delete,
    topic_put,
)
from ledgermq.broker.queue_repair import (
    DamagedUnitError,
    check_read,
    read_message_run,
)
from ledgermq.broker.state import Stored, TopicConfig
from ledgermq.broker.view import BrokerView, ControlOp, SendAck
from ledgermq.wire import Connection, Handler

PULL_BYTES_MAX = 4 << 20
FILTER_SCAN_MAX = 2048
_QUEUE_ID = struct.Struct("<I")

Body = dict[str, Any]  # a request's or answer's map
Ident = tuple[int, int]  # (producer_id, sequence); producer 0: not idempotent


@dataclass(frozen=True, slots=True)
class _Stored:
    """A send request's new records as group commit stored them."""

    ack: SendAck
    records: Records


# A record's result, to be read from the request that stores it: (its
# request's future, its index among that request's new records).
_InFlight = tuple["asyncio.Future[_Stored]", int]


@dataclass(slots=True)
class _Storing:
    """A send request on its way through group commit (Handlers._store_start):
    what it proposed and what its duplicates wait for."""

    records: Records  # the records proposed: all, or the new ones
    submitted: asyncio.Future[SendAck] | None  # their proposal; None: nothing new
    # Set when some records are duplicates: a result per record, the indexes
    # of the new ones, retries of records in flight elsewhere (index, where
    # to read the result) and repeats within the request (index, earlier index).
    results: list[Body | None] | None
    fresh_at: list[int] | None
    waits: list[tuple[int, _InFlight]]
    repeats: list[tuple[int, int]]
    # What this request put in flight, and the future other requests that
    # retry one of its records wait on.
    mine: list[tuple[Ident, _InFlight]]
    shared: asyncio.Future[_Stored] | None


def _records_answer(scanned: Scanned, results: list[Body] | None,
                    done: _Stored | None) -> Body:
    """The answer to a `records` send: a result per record when some were
    duplicates; else O(1) per request, because the client knows every
    record's size and queue: the first record's position and each queue's
    first offset say it all."""
    if results is not None:
        return {"results": results}
    assert done is not None
    first, stored = done.ack.first, done.ack.stored
    return {"base": first, "queue_offsets": None if stored is None else [
        stored[i].queue_offset for i in scanned.firsts]}


def _filled(result: Body | None) -> Body:
    assert result is not None, "every record of a request gets a result"
    return result


def _map(body: Any) -> Body:
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a map")
    return body


def _field(body: Body, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    value = body.get(key, default)
    if value is ... or not isinstance(value, kind) or (
            isinstance(value, bool) and kind is int):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise InvalidRequestError(f"field {key!r} is required and must be {name}")
    return value


def _nonneg(body: Body, key: str, default: Any = ...) -> int:
    value: int = _field(body, key, int, default)
    if value < 0:
        raise InvalidRequestError(f"field {key!r} must not be negative")
    return value


class Handlers:
    def __init__(self, broker: BrokerView) -> None:
        self.b = broker
        self._creating: dict[str, asyncio.Task[None]] = {}
        self._inflight_seq: dict[Ident, _InFlight] = {}
        # Highest sequence ever put in flight per producer (a lower bound for
        # "is anything of this request already in flight?"; never too low).
        self._inflight_high: dict[int, int] = {}

    # ---------------------------------------------------------------- ACL

    def _allow(self, conn: Connection, action: Action, topic: str | None = None,
               group: str | None = None) -> None:
        """Raise unless `conn`'s principal may do `action` (docs/security.md,
        "Authorisation: the ACL").
        A broker without a cluster secret runs open: everything is allowed."""
        if not self.b.config.cluster_secret_file:
            return
        self.b.state.acl.authorize(conn.principal, peer_host(conn.peer), action, topic, group)

    def _allow_pull(self, conn: Connection, body: Body, topic: str) -> None:
        """SUB on the topic, and on the consumer group when the request names one."""
        group = group_field(body) if body.get("group") is not None else None
        self._allow(conn, Action.SUB, topic, group)

    # ------------------------------------------------------------- topics

    async def _writable(self) -> None:
        """A send may go ahead here; during a failover it is held until the
        group has a leader again (`wait_writable`), not refused at once."""
        try:
            self.b.require_writable()
        except (NotLeaderError, ServiceUnavailableError):
            await self.b.wait_writable()

    def _writable_now(self) -> bool:
        """A send may go ahead at once (`_writable` would not wait)."""
        try:
            self.b.require_writable()
        except (NotLeaderError, ServiceUnavailableError):
            return False
        return True

    def _require_space(self) -> None:
        """New messages are refused while the disk is above disk_hard_ratio
        (DISK_FULL); control operations are not: they are tiny, and trims and
        offset commits are how a full broker recovers."""
        retention = self.b.retention
        if retention is not None:
            retention.require_space()

    def _topic(self, topic: str) -> TopicConfig:
        config = self.b.state.topics.get(topic)
        if config is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist", data={"topic": topic})
        return config

    def _queue(self, topic: str, queue_id: int) -> TopicConfig:
        """The topic of an existing queue: UNKNOWN_TOPIC, or INVALID_REQUEST
        for a queue id beyond the topic's queues."""
        config = self._topic(topic)
        if queue_id >= config.queues:
            raise InvalidRequestError(
                f"queue {queue_id} does not exist: topic {topic!r} has {config.queues} queues")
        return config

    async def _propose_control(self, op: ControlOp) -> None:
        assert self.b.controls is not None
        await self.b.controls.submit(op, 64)

    async def _topic_for_write(self, topic: str) -> TopicConfig:
        config = self.b.state.topics.get(topic)
        if config is None:
            if not self.b.config.auto_create_topics:
                raise UnknownTopicError(
                    f"topic {topic!r} does not exist and auto_create_topics is off",
                    data={"topic": topic})
            task = self._creating.get(topic)
            if task is None:
                task = asyncio.ensure_future(self._propose_control(
                    topic_put(topic, self.b.config.default_queues)))
                self._creating[topic] = task
                task.add_done_callback(lambda _t: self._creating.pop(topic, None))
            await asyncio.shield(task)
        return self._existing_topic_for_write(topic)

    def _existing_topic_for_write(self, topic: str) -> TopicConfig:
        config = self._topic(topic)
        if not config.perm & PERM_WRITE:
            raise NoPermissionError(f"topic {topic!r} is not writable (perm {config.perm})",
                                    data={"topic": topic, "perm": config.perm})
        return config

    async def create_topic(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        body = _map(body)
        topic = _field(body, "topic", str)
        if not valid_topic(topic):
            raise InvalidRequestError(f"invalid topic name {topic!r}")
        queues = _field(body, "queues", int, self.b.config.default_queues)
        perm = _field(body, "perm", int, PERM_RW)
        if not 1 <= queues <= MAX_QUEUES:
            raise InvalidRequestError(f"queues must be in [1, {MAX_QUEUES}]")
        if perm & ~PERM_RW:
            raise InvalidRequestError("perm must be a subset of 6 (4 read, 2 write)")
        self.b.require_writable()
        await self._propose_control(topic_put(topic, queues, perm))
        return {"topic": topic, **self._topic(topic).to_wire()}

    async def delete_topic(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        topic = topic_field(_map(body))
        self._topic(topic)
        self.b.require_writable()
        await self._propose_control(topic_delete(topic))
        return {"deleted": topic not in self.b.state.topics}

    async def get_topics(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ANY)
        topics = self.b.state.topics
        out: Body = {}
        for name, config in sorted(topics.items()):
            view: Body = dict(config.to_wire())
            view["offsets"] = [list(self.b.cq.offsets(name, q)) for q in range(config.queues)]
            out[name] = view
        return {"topics": out}

    # --------------------------------------------------------------- send

    def _result(self, stored: Stored | None) -> Body:
        if stored is None:
            return {"msg_id": None, "queue_id": None, "queue_offset": None, "duplicate": True}
        return {"msg_id": message_id(self.b.config.group, stored.physical_offset),
                "queue_id": stored.queue_id, "queue_offset": stored.queue_offset,
                "duplicate": True}

    def _stored_result(self, done: _Stored, k: int, duplicate: bool) -> Body:
        """The result map of record `k` of a stored `Records` (see _store)."""
        first, stored, records = done.ack.first, done.ack.stored, done.records
        start = records.starts[k]
        if stored is not None:
            queue_id, queue_offset = stored[k].queue_id, stored[k].queue_offset
        else:
            queue_id, queue_offset = _QUEUE_ID.unpack_from(records.blob, start + 4)[0], None
        return {"msg_id": message_id(self.b.config.group, first + start), "queue_id": queue_id,
                "queue_offset": queue_offset, "duplicate": duplicate}

    def send(self, body: Any, conn: Connection) -> Awaitable[Any]:
        """SEND_MESSAGES. A request of records this node can store at once
        (it is the ready leader, its topics exist, none of its records is
        being stored by another request) is checked here and answered from
        its proposal's future, without a task (the per-message path); any
        other request goes on in a coroutine."""
        body = _map(body)
        if "records" in body:
            return self._send_records(body, conn)
        return self._send_messages(body, conn)

    async def _send_messages(self, body: Body, conn: Connection) -> Body:
        """SEND_MESSAGES with `messages`: msgpack maps, encoded here."""
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise InvalidRequestError("field 'messages' must be a non-empty list")
        await self._writable()
        self._require_space()
        limit = self.b.config.message_size_bytes_max
        messages = []
        for i, m in enumerate(raw):
            try:
                messages.append(encode_wire_message(m, limit))
            except StorageTooLarge as exc:
                raise MessageTooLargeError(
                    f"message {i} of {exc.size} bytes exceeds message_size_bytes_max {limit}",
                    data={"index": i, "size": exc.size, "limit": limit}) from None
        for topic in sorted({m.topic for m in messages}):
            self._allow(conn, Action.PUB, topic)
        for topic in {m.topic for m in messages}:
            config = await self._topic_for_write(topic)
            for m in messages:
                if m.topic == topic and m.queue_id >= config.queues:
                    raise InvalidRequestError(
                        f"queue {m.queue_id} does not exist: topic {topic!r} has"
                        f" {config.queues} queues")
        starts = []
        at = 0
        for m in messages:
            starts.append(at)
            at += len(m.record)
        records = Records(b"".join(m.record for m in messages), starts)
        results, done = await self._store(records, [(m.producer_id, m.sequence)
                                                    for m in messages])
        if results is None:
            assert done is not None
            results = [self._stored_result(done, k, False) for k in range(len(messages))]
        return {"results": results}

    def _send_records(self, body: Body, conn: Connection) -> Awaitable[Body]:
        """SEND_MESSAGES with `records`: the client's CommitLog records as one
        blob, checked in one pass and stored as they are (docs/protocol.md)."""
        limit = self.b.config.message_size_bytes_max
        scanned = scan_records(body["records"], limit)
        count = body.get("count")
        if count is not None and count != len(scanned.starts):
            raise InvalidRequestError(
                f"field 'count' is {count!r} but the blob holds {len(scanned.starts)} records")
        for name in scanned.topics:
            self._allow(conn, Action.PUB, name.decode())
        topics = self.b.state.topics
        if not self._writable_now() or any(name.decode() not in topics
                                           for name in scanned.topics):
            return self._send_records_later(body, scanned)
        return self._store_records(body, scanned)

    async def _send_records_later(self, body: Body, scanned: Scanned) -> Body:
        """A send that waits for a leader or for its topics to be created."""
        await self._writable()
        self._require_space()
        for name in scanned.topics:
            await self._topic_for_write(name.decode())
        return await self._store_records(body, scanned)

    def _store_records(self, body: Body, scanned: Scanned) -> Awaitable[Body]:
        self._require_space()
        for name, top in scanned.topics.items():
            topic = name.decode()
            config = self._existing_topic_for_write(topic)
            if top >= config.queues:
                raise InvalidRequestError(
                    f"queue {top} does not exist: topic {topic!r} has {config.queues} queues")
        storing = self._store_start(
            Records(body["records"], scanned.starts, scanned.columns), scanned.idents)
        submitted = storing.submitted
        if submitted is None or storing.waits:
            return self._records_answer_later(scanned, self._store_wait(storing))
        answer: asyncio.Future[Body] = asyncio.get_running_loop().create_future()
        submitted.add_done_callback(partial(self._records_stored, storing, scanned, answer))
        return answer

    def _records_stored(self, storing: _Storing, scanned: Scanned, answer: asyncio.Future[Body],
                        _submitted: asyncio.Future[SendAck]) -> None:
        outcome = self._settle(storing)
        if answer.done():
            return  # the connection closed
        if isinstance(outcome, asyncio.CancelledError):
            answer.cancel()
        elif isinstance(outcome, BaseException):
            answer.set_exception(outcome)
        else:
            try:
                body = _records_answer(scanned, self._results(storing, outcome), outcome)
            except Exception as exc:  # our bug: answered INTERNAL, not left hanging
                answer.set_exception(exc)
            else:
                answer.set_result(body)

    async def _records_answer_later(
            self, scanned: Scanned,
            storing: Awaitable[tuple[list[Body] | None, _Stored | None]]) -> Body:
        results, done = await storing
        return _records_answer(scanned, results, done)

    def _all_new(self, idents: list[Ident]) -> bool:
        """True when every record is an idempotent one of one producer, in
        increasing sequence, above anything stored or in flight for it: the
        normal request, which then needs no per-record duplicate check."""
        producer_id, first = idents[0]
        if not producer_id:
            return False
        if (first <= self._inflight_high.get(producer_id, -1)
                or first <= self.b.state.producers.high(producer_id)):
            return False
        previous = first
        for pid, seq in idents[1:]:
            if pid != producer_id or seq <= previous:
                return False
            previous = seq
        return True

    def _note_inflight_high(self, mine: list[tuple[Ident, _InFlight]]) -> None:
        highs = self._inflight_high
        if len(highs) > 100_000:
            highs.clear()  # only makes _all_new answer False until refilled
        for (producer_id, seq), _ in mine:
            if seq > highs.get(producer_id, -1):
                highs[producer_id] = seq

    async def _store(self, records: Records, idents: list[Ident]
                     ) -> tuple[list[Body] | None, _Stored | None]:
        """Store the records whose (producer_id, sequence) is new.

        Returns (None, done) when every record was new and stored, `done`
        saying where they went; otherwise (a result map per record, done or
        None when nothing was new).
        """
        return await self._store_wait(self._store_start(records, idents))

    def _store_start(self, records: Records, idents: list[Ident]) -> _Storing:
        """Sort a request's records into new ones, which go to group commit
        now, and duplicates (stored before, in flight in another request, or
        repeated within this one)."""
        results: list[Body | None] | None = None
        fresh_at: list[int] | None = None
        waits: list[tuple[int, _InFlight]] = []
        repeats: list[tuple[int, int]] = []  # (index, index of the same identity earlier)
        first_of: dict[tuple[int, int], int] = {}
        lookup = self.b.state.producers.lookup
        inflight = self._inflight_seq
        all_new = self._all_new(idents)
        for i, key in enumerate(idents if not all_new else ()):
            if key[0]:
                known, stored = lookup(key[0], key[1])
                earlier = None if known else inflight.get(key)
                if known or earlier is not None or key in first_of:
                    if fresh_at is None:
                        fresh_at = list(range(i))
                        results = [None] * len(idents)
                    assert results is not None
                    if known:
                        results[i] = self._result(stored)
                    elif earlier is not None:
                        waits.append((i, earlier))
                    else:
                        repeats.append((i, first_of[key]))
                    continue
                first_of[key] = i
            if fresh_at is not None:
                fresh_at.append(i)
        storing = _Storing(records, None, results, fresh_at, waits, repeats, [], None)
        if fresh_at is not None and not fresh_at:
            return storing  # nothing new
        if fresh_at is not None:
            # Some records are duplicates: store the others only.
            blob, starts = records.blob, records.starts
            ends = [*starts[1:], len(blob)]
            parts = [blob[starts[i] : ends[i]] for i in fresh_at]
            sub_starts = []
            at = 0
            for part in parts:
                sub_starts.append(at)
                at += len(part)
            records = storing.records = Records(b"".join(parts), sub_starts)
            fresh_idents = [idents[i] for i in fresh_at]
        else:
            fresh_idents = idents
        total = len(records.blob)
        if total + 64 > self.b.entry_limit:
            raise MessageTooLargeError(
                f"batch of {total} bytes exceeds the entry limit {self.b.entry_limit}",
                data={"limit": self.b.entry_limit})
        # One future for the whole request: a concurrent retry of any of its
        # idempotent messages waits on it and takes its own slot.
        shared: asyncio.Future[_Stored] = asyncio.get_running_loop().create_future()
        mine = [(key, (shared, k)) for k, key in enumerate(fresh_idents) if key[0]]
        storing.mine, storing.shared = mine, shared
        inflight.update(mine)
        if mine:
            # All new: increasing, so the last is the highest.
            self._note_inflight_high(mine[-1:] if all_new else mine)
        assert self.b.sends is not None
        try:
            storing.submitted = self.b.sends.submit(records, total, len(records.starts))
        except BaseException as exc:
            self._settled(storing, exc)
            raise
        return storing

    def _settle(self, storing: _Storing) -> _Stored | BaseException:
        """The request's proposal ended: where its records went, or why not."""
        submitted = storing.submitted
        assert submitted is not None and submitted.done()
        if submitted.cancelled():
            return self._settled(storing, asyncio.CancelledError())
        error = submitted.exception()
        if error is not None:
            return self._settled(storing, error)
        return self._settled(storing, _Stored(submitted.result(), storing.records))

    def _settled(self, storing: _Storing, outcome: _Stored | BaseException
                 ) -> _Stored | BaseException:
        """Take the request's records out of flight and tell the retries
        waiting on them."""
        inflight = self._inflight_seq
        for key, _ in storing.mine:
            inflight.pop(key, None)
        shared = storing.shared
        if shared is not None and not shared.done():
            if isinstance(outcome, BaseException):
                shared.set_exception(outcome)
                shared.exception()  # retrieved: there may be no waiter
            else:
                shared.set_result(outcome)
        return outcome

    async def _store_wait(self, storing: _Storing) -> tuple[list[Body] | None, _Stored | None]:
        """`_store`'s answer, once the request's proposal and the other
        requests its duplicates wait for have ended."""
        done = None
        submitted = storing.submitted
        if submitted is not None:
            try:
                await submitted
            finally:
                outcome = self._settle(storing)
            if isinstance(outcome, BaseException):
                raise outcome
            done = outcome
        results = storing.results
        for i, (future, k) in storing.waits:
            assert results is not None
            results[i] = self._stored_result(await asyncio.shield(future), k, True)
        return self._results(storing, done), done

    def _results(self, storing: _Storing, done: _Stored | None) -> list[Body] | None:
        """A result per record, or None when every record was new (then
        `done` says it all); the retries' results are in already."""
        results = storing.results
        if results is None:
            return None
        if done is not None:
            assert storing.fresh_at is not None
            for k, i in enumerate(storing.fresh_at):
                results[i] = self._stored_result(done, k, False)
        for i, j in storing.repeats:
            results[i] = dict(_filled(results[j]), duplicate=True)  # j < i: filled above
        return [_filled(r) for r in results]

    # --------------------------------------------------------------- pull

    async def pull(self, body: Any, conn: Connection) -> Any:
        body = _map(body)
        topic = topic_field(body)
        queue_id = queue_id_field(body)
        offset = offset_field(body, "offset")
        limit = self.b.config.pull_max_messages
        max_count = min(_nonneg(body, "max_messages", 32), limit) or 1
        wait_ms = min(_nonneg(body, "wait_ms", 0), self.b.config.long_poll_timeout_ms)
        tags = body.get("tags")
        if tags is not None and not (isinstance(tags, list)
                                     and all(isinstance(t, str) for t in tags)):
            raise InvalidRequestError("field 'tags' must be a list of strings or nil")
        self._allow_pull(conn, body, topic)
        config = self._topic(topic)
        if not config.perm & PERM_READ:
            raise NoPermissionError(f"topic {topic!r} is not readable (perm {config.perm})",
                                    data={"topic": topic, "perm": config.perm})
        if queue_id >= config.queues:
            raise InvalidRequestError(
                f"queue {queue_id} does not exist: topic {topic!r} has {config.queues} queues")
        cq = self.b.cq
        lo, hi = cq.offsets(topic, queue_id)
        # Only a leader serving writes knows the queue's true end. A follower
        # (or a leader not ready yet) may just be behind after a failover: it
        # must not make a consumer rewind to its own end (a redelivery storm)
        # or skip ahead, so it answers "nothing yet" at the consumer's offset.
        authoritative = self.b.node.leader_ready
        if offset < lo:
            # Retention deleted it (or the topic was re-created): say where the
            # queue starts now, so the consumer can continue there.
            raise OffsetMovedError(
                f"offset {offset} of queue {topic}/{queue_id} is no longer stored (retention);"
                f" the oldest retained message is at offset {lo}",
                data={"min_offset": lo, "max_offset": hi, "requested": offset})
        if offset > hi and authoritative:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside queue {topic}/{queue_id}'s range [{lo}, {hi}]",
                data={"min_offset": lo, "max_offset": hi})
        if offset >= hi and wait_ms:
            await self.b.longpoll.wait((topic, queue_id), wait_ms / 1000)
            lo, hi = cq.offsets(topic, queue_id)
        if offset > hi:
            return {"messages": [], "next_offset": offset, "min_offset": lo,
                    "max_offset": hi}
        key = (topic, queue_id)
        wanted = set(tags) if tags and "*" not in tags else None
        try:
            messages, next_offset = self._read_queue(key, max(offset, lo), max_count, wanted)
        except DamagedUnitError as damage:
            # Rebuilt from the log, the queue is read again from the start.
            await self.b.queue_repairs.repair(cq, damage)
            try:
                messages, next_offset = self._read_queue(key, max(offset, lo), max_count, wanted)
            except DamagedUnitError as again:
                raise ServiceUnavailableError(
                    f"{again}, again after a rebuild from the log; retry, or restart the node"
                ) from None
        return {"messages": messages, "next_offset": next_offset, "min_offset": lo,
                "max_offset": hi}

    def _read_queue(self, key: tuple[str, int], offset: int, max_count: int,
                    wanted: set[str] | None) -> tuple[list[Body], int]:
        """Up to `max_count` messages of queue `key` from `offset` (tags in
        `wanted`, if given), each checked against its unit (queue_repair.py),
        and the offset to read from next."""
        cq = self.b.cq
        scan = max_count if wanted is None else FILTER_SCAN_MAX
        units = cq.read(*key, offset, scan)
        next_offset = offset
        messages = []
        if wanted is not None:
            hashes = {tag_hash(t) for t in wanted}
            candidates = [u for u in units if u.tag_hash in hashes]
        else:
            candidates = units
        truncated = len(candidates) > max_count
        take: list[Unit] = []
        size = 0
        for unit in candidates[:max_count]:
            # Cap the answer's size before reading anything.
            if take and size + unit.size > PULL_BYTES_MAX:
                truncated = True
                break
            take.append(unit)
            size += unit.size
        group = self.b.config.group
        stored = check_read(key, take, partial(read_message_run, self.b.node.log)) if take else []
        for unit, sm in zip(take, stored, strict=True):
            # The tag hash narrowed the candidates; the text decides (hashes collide).
            if wanted is None or sm.message.tags in wanted:
                messages.append(message_view(group, sm, unit.queue_offset))
            next_offset = unit.queue_offset + 1
        if wanted is not None and units and not truncated:
            # Every scanned unit was looked at: skip past the ones filtered out.
            next_offset = max(next_offset, units[-1].queue_offset + 1)
        return messages, next_offset

    async def queue_offsets(self, body: Any, conn: Connection) -> Any:
        body = _map(body)
        topic = topic_field(body)
        queue_id = queue_id_field(body)
        self._allow_pull(conn, body, topic)
        self._queue(topic, queue_id)
        lo, hi = self.b.cq.offsets(topic, queue_id)
        return {"min_offset": lo, "max_offset": hi}

    # ------------------------------------------------------------- offsets

    async def commit_offsets(self, body: Any, conn: Connection) -> Any:
        group, offsets = commit_offsets_body(body)
        items = []
        self._allow(conn, Action.SUB, group=group)
        for topic in sorted({topic for topic, _, _ in offsets}):
            self._allow(conn, Action.SUB, topic)
        for topic, queue_id, offset in offsets:
            self._queue(topic, queue_id)
            lo, hi = self.b.cq.offsets(topic, queue_id)
            if offset > hi:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is beyond the end of {topic}/{queue_id} ({hi})",
                    data={"min_offset": lo, "max_offset": hi})
            items.append((group, topic, queue_id, offset))
        self.b.require_writable()
        if items:
            await self._propose_control({"op": "offsets.commit",
                                         "offsets": [list(i) for i in items]})
        return {}

    async def query_offset(self, body: Any, conn: Connection) -> Any:
        body = _map(body)
        group = group_field(body)
        topic = topic_field(body)
        queue_id = queue_id_field(body)
        self._allow(conn, Action.SUB, topic, group)
        return {"offset": self.b.state.offset_of(group, topic, queue_id)}

    # ----------------------------------------------------------- membership

    async def heartbeat(self, body: Any, conn: Connection) -> Any:
        body = _map(body)
        group = group_field(body)
        client_id = client_id_field(body)
        self._allow(conn, Action.SUB, group=group)
        if body.get("leave"):
            return {"left": self.b.members.leave(group, client_id)}
        subs = subscriptions_field(body)
        mode = body.get("mode", "clustering")
        self.b.members.heartbeat(group, client_id, subs, str(mode), monotonic_ms())
        return {}

    async def members(self, body: Any, conn: Connection) -> Any:
        group = group_field(_map(body))
        self._allow(conn, Action.SUB, group=group)
        return {"members": self.b.members.members(group, monotonic_ms())}

    async def status(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ANY)
        info = self.b.status()
        info["groups"] = self.b.members.describe(monotonic_ms())
        return info

    # ---------------------------------------------------- ACL administration

    def _acl_user(self, body: Body) -> str:
        key = _field(body, "access_key", str)
        if not valid_access_key(key):
            raise InvalidRequestError(f"invalid access key {key!r}")
        return key

    def _public_user(self, key: str) -> Body:
        user = self.b.state.acl.users.get(key)
        if user is None:
            # Deleted by a concurrent request between the check and the apply.
            raise InvalidRequestError(f"no ACL user {key!r}", data={"access_key": key})
        return user.to_public()

    def _known_user(self, key: str) -> User:
        user = self.b.state.acl.users.get(key)
        if user is None:
            raise InvalidRequestError(f"no ACL user {key!r}", data={"access_key": key})
        return user

    async def acl_put_user(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        body = _map(body)
        key = self._acl_user(body)
        if key == self.b.config.admin_access_key:
            raise InvalidRequestError(
                f"{key!r} is the bootstrap administrator's access key (admin_access_key);"
                " it cannot be an ACL user")
        known = self.b.state.acl.users.get(key)
        if "secret" not in body and known is None:
            raise InvalidRequestError(f"a new user needs a secret ({key!r} does not exist)")
        record = {k: body[k] for k in ("access_key", "secret", "admin", "allow", "topics",
                                       "groups") if k in body}
        try:
            User.from_record(record, secret=known.secret if known else None)
        except AclError as exc:
            raise InvalidRequestError(str(exc)) from None
        self.b.require_writable()
        await self._propose_control(acl_user_put(record))
        return {"user": self._public_user(key), "created": known is None}

    async def acl_delete_user(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        key = self._acl_user(_map(body))
        existed = key in self.b.state.acl.users
        self.b.require_writable()
        if existed:
            await self._propose_control(acl_user_delete(key))
        return {"deleted": existed and key not in self.b.state.acl.users}

    async def acl_get_users(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        users = self.b.state.acl.users
        return {"users": [users[k].to_public() for k in sorted(users)]}

    async def acl_grant(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        body = _map(body)
        key = self._acl_user(body)
        topics, groups = body.get("topics") or {}, body.get("groups") or {}
        try:
            parsed_topics = parse_grants(topics, group=False)
            parsed_groups = parse_grants(groups, group=True)
            self._known_user(key).with_grants(parsed_topics, parsed_groups)
        except AclError as exc:
            raise InvalidRequestError(str(exc)) from None
        if not parsed_topics and not parsed_groups:
            raise InvalidRequestError("nothing to grant: give 'topics' and/or 'groups'")
        self.b.require_writable()
        await self._propose_control(acl_grant(
            key, {k: perm_name(v) for k, v in parsed_topics.items()},
            {k: perm_name(v) for k, v in parsed_groups.items()}))
        return {"user": self._public_user(key)}

    async def acl_revoke(self, body: Any, conn: Connection) -> Any:
        self._allow(conn, Action.ADMIN)
        body = _map(body)
        key = self._acl_user(body)
        topics, groups = body.get("topics") or [], body.get("groups") or []
        if not (isinstance(topics, list) and isinstance(groups, list)
                and all(isinstance(n, str) for n in [*topics, *groups])):
            raise InvalidRequestError("fields 'topics' and 'groups' must be lists of names")
        if not topics and not groups:
            raise InvalidRequestError("nothing to revoke: give 'topics' and/or 'groups'")
        self._known_user(key)
        self.b.require_writable()
        await self._propose_control(acl_revoke(key, topics, groups))
        return {"user": self._public_user(key)}


def handlers_for(broker: BrokerView) -> dict[int, Handler]:
    h = Handlers(broker)
    return {
        RequestCode.SEND_MESSAGES: h.send,
        RequestCode.PULL_MESSAGES: h.pull,
        RequestCode.CREATE_TOPIC: h.create_topic,
        RequestCode.DELETE_TOPIC: h.delete_topic,
        RequestCode.GET_TOPICS: h.get_topics,
        RequestCode.COMMIT_OFFSETS: h.commit_offsets,
        RequestCode.QUERY_OFFSET: h.query_offset,
        RequestCode.CLIENT_HEARTBEAT: h.heartbeat,
        RequestCode.GET_MEMBERS: h.members,
        RequestCode.GET_QUEUE_OFFSETS: h.queue_offsets,
        RequestCode.BROKER_STATUS: h.status,
        RequestCode.ACL_PUT_USER: h.acl_put_user,
        RequestCode.ACL_DELETE_USER: h.acl_delete_user,
        RequestCode.ACL_GET_USERS: h.acl_get_users,
        RequestCode.ACL_GRANT: h.acl_grant,
        RequestCode.ACL_REVOKE: h.acl_revoke,
    }



