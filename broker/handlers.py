"""Client request handlers of a broker node (request codes 200-399).

Each handler validates its body (INVALID_REQUEST names the field), checks
where the request may run (writes: the ready leader; reads: any node, which
serves committed data only) and answers with the map docs/protocol.md gives.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from broker.codec import encode_wire_message, message_id, message_view
from broker.control import MAX_QUEUES, PERM_READ, PERM_RW, PERM_WRITE, topic_delete, topic_put
from broker.state import Stored, TopicConfig
from commitlog import StoredMessage, decode_message_at, tag_hash
from commitlog.errors import MessageTooLargeError as StorageTooLarge
from commitlog.message import valid_topic
from consumequeue import Unit
from ledgermq.codes import RequestCode
from ledgermq.errors import (
    InvalidRequestError,
    MessageTooLargeError,
    NoPermissionError,
    OffsetOutOfRangeError,
    UnknownTopicError,
)
from ledgermq.wire import Connection, Handler

if TYPE_CHECKING:
    from broker.server import Broker

PULL_BYTES_MAX = 4 << 20
FILTER_SCAN_MAX = 2048
_RUN_BYTES = 1 << 20


def _map(body: Any) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a map")
    return body


def _field(body: dict, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    value = body.get(key, default)
    if value is ... or not isinstance(value, kind) or (
            isinstance(value, bool) and kind is int):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise InvalidRequestError(f"field {key!r} is required and must be {name}")
    return value


def _nonneg(body: dict, key: str, default: Any = ...) -> int:
    value = _field(body, key, int, default)
    if value < 0:
        raise InvalidRequestError(f"field {key!r} must not be negative")
    return value


class Handlers:
    def __init__(self, broker: Broker) -> None:
        self.b = broker
        self._creating: dict[str, asyncio.Task[None]] = {}
        self._inflight_seq: dict[tuple[int, int], tuple[asyncio.Future[list[dict]], int]] = {}

    # ------------------------------------------------------------- topics

    def _topic(self, topic: str) -> TopicConfig:
        config = self.b.state.topics.get(topic)
        if config is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist", data={"topic": topic})
        return config

    async def _propose_control(self, op: dict) -> None:
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
            config = self._topic(topic)
        if not config.perm & PERM_WRITE:
            raise NoPermissionError(f"topic {topic!r} is not writable (perm {config.perm})",
                                    data={"topic": topic, "perm": config.perm})
        return config

    async def create_topic(self, body: Any, conn: Connection) -> Any:
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
        topic = _field(_map(body), "topic", str)
        self._topic(topic)
        self.b.require_writable()
        await self._propose_control(topic_delete(topic))
        return {"deleted": topic not in self.b.state.topics}

    async def get_topics(self, body: Any, conn: Connection) -> Any:
        topics = self.b.state.topics
        out = {}
        for name, config in sorted(topics.items()):
            view = config.to_wire()
            view["offsets"] = [list(self.b.cq.offsets(name, q)) for q in range(config.queues)]
            out[name] = view
        return {"topics": out}

    # --------------------------------------------------------------- send

    def _result(self, stored: Stored | None) -> dict:
        if stored is None:
            return {"msg_id": None, "queue_id": None, "queue_offset": None, "duplicate": True}
        return {"msg_id": message_id(self.b.config.group, stored.physical_offset),
                "queue_id": stored.queue_id, "queue_offset": stored.queue_offset,
                "duplicate": True}

    async def send(self, body: Any, conn: Connection) -> Any:
        body = _map(body)
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise InvalidRequestError("field 'messages' must be a non-empty list")
        self.b.require_writable()
        limit = self.b.config.message_size_bytes_max
        messages = []
        for i, m in enumerate(raw):
            try:
                messages.append(encode_wire_message(m, limit))
            except StorageTooLarge as exc:
                raise MessageTooLargeError(
                    f"message {i} of {exc.size} bytes exceeds message_size_bytes_max {limit}",
                    data={"index": i, "size": exc.size, "limit": limit}) from None
        for topic in {m.topic for m in messages}:
            config = await self._topic_for_write(topic)
            for m in messages:
                if m.topic == topic and m.queue_id >= config.queues:
                    raise InvalidRequestError(
                        f"queue {m.queue_id} does not exist: topic {topic!r} has"
                        f" {config.queues} queues")
        results: list[dict | None] = [None] * len(messages)
        waits: list[tuple[int, tuple[asyncio.Future[list[dict]], int]]] = []
        fresh: list[tuple[bytes, int]] = []
        fresh_at: list[int] = []
        producers = self.b.state.producers
        repeats: list[tuple[int, int]] = []  # (index, index of the same identity earlier)
        first_of: dict[tuple[int, int], int] = {}
        for i, m in enumerate(messages):
            if m.producer_id:
                key = (m.producer_id, m.sequence)
                known, stored = producers.lookup(m.producer_id, m.sequence)
                if known:
                    results[i] = self._result(stored)
                    continue
                earlier = self._inflight_seq.get(key)
                if earlier is not None:
                    waits.append((i, earlier))
                    continue
                if key in first_of:
                    repeats.append((i, first_of[key]))
                    continue
                first_of[key] = i
            fresh.append((m.record, m.queue_id))
            fresh_at.append(i)
        if fresh:
            total = sum(len(r) for r, _ in fresh)
            if total + 64 > self.b.entry_limit:
                raise MessageTooLargeError(
                    f"batch of {total} bytes exceeds the entry limit {self.b.entry_limit}",
                    data={"limit": self.b.entry_limit})
            # One future for the whole request: a concurrent retry of any of its
            # idempotent messages waits on it and takes its own slot.
            shared: asyncio.Future[list[dict]] = asyncio.get_running_loop().create_future()
            mine = []
            for k, i in enumerate(fresh_at):
                m = messages[i]
                if m.producer_id:
                    key = (m.producer_id, m.sequence)
                    self._inflight_seq[key] = (shared, k)
                    mine.append(key)
            try:
                assert self.b.sends is not None
                out = await self.b.sends.submit(fresh, total, len(fresh))
            except BaseException as exc:
                shared.set_exception(exc)
                shared.exception()  # retrieved: there may be no waiter
                raise
            finally:
                for key in mine:
                    self._inflight_seq.pop(key, None)
            shared.set_result(out)
            for k, i in enumerate(fresh_at):
                results[i] = out[k]
        for i, (future, k) in waits:
            results[i] = dict((await asyncio.shield(future))[k], duplicate=True)
        for i, j in repeats:
            results[i] = dict(results[j], duplicate=True)
        return {"results": results}

    # --------------------------------------------------------------- pull

    def _read_units(self, units: list[Unit]) -> list[StoredMessage]:
        """Decode the messages of `units`, reading nearby records in one call."""
        log_ = self.b.node.log
        segment = log_.config.segment_size_bytes
        out: list[StoredMessage] = []
        i = 0
        while i < len(units):
            start = units[i].physical_offset
            j = i + 1
            while (j < len(units) and units[j].physical_offset >= start
                   and units[j].physical_offset + units[j].size - start <= _RUN_BYTES
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

    async def pull(self, body: Any, conn: Connection) -> Any:
        body = _map(body)
        topic = _field(body, "topic", str)
        queue_id = _nonneg(body, "queue_id")
        offset = _nonneg(body, "offset")
        limit = self.b.config.pull_max_messages
        max_count = min(_nonneg(body, "max_messages", 32), limit) or 1
        wait_ms = min(_nonneg(body, "wait_ms", 0), self.b.config.long_poll_timeout_ms)
        tags = body.get("tags")
        if tags is not None and not (isinstance(tags, list)
                                     and all(isinstance(t, str) for t in tags)):
            raise InvalidRequestError("field 'tags' must be a list of strings or nil")
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
        if offset < lo or (offset > hi and authoritative):
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside queue {topic}/{queue_id}'s range [{lo}, {hi}]",
                data={"min_offset": lo, "max_offset": hi})
        if offset >= hi and wait_ms:
            await self.b.longpoll.wait((topic, queue_id), wait_ms / 1000)
            lo, hi = cq.offsets(topic, queue_id)
        if offset > hi:
            return {"messages": [], "next_offset": offset, "min_offset": lo,
                    "max_offset": hi}
        wanted = set(tags) if tags and "*" not in tags else None
        scan = max_count if wanted is None else FILTER_SCAN_MAX
        units = cq.read(topic, queue_id, max(offset, lo), scan)
        next_offset = max(offset, lo)
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
        for unit, sm in zip(take, self._read_units(take), strict=True):
            # The tag hash narrowed the candidates; the text decides (hashes collide).
            if wanted is None or sm.message.tags in wanted:
                messages.append(message_view(group, sm, unit.queue_offset))
            next_offset = unit.queue_offset + 1
        if wanted is not None and units and not truncated:
            # Every scanned unit was looked at: skip past the ones filtered out.
            next_offset = max(next_offset, units[-1].queue_offset + 1)
        return {"messages": messages, "next_offset": next_offset, "min_offset": lo,
                "max_offset": hi}

    async def queue_offsets(self, body: Any, conn: Connection) -> Any:
        body = _map(body)
        topic = _field(body, "topic", str)
        queue_id = _nonneg(body, "queue_id")
        self._topic(topic)
        lo, hi = self.b.cq.offsets(topic, queue_id)
        return {"min_offset": lo, "max_offset": hi}

    # ------------------------------------------------------------- offsets

    async def commit_offsets(self, body: Any, conn: Connection) -> Any:
        body = _map(body)
        group = _field(body, "group", str)
        raw = body.get("offsets")
        if not isinstance(raw, list):
            raise InvalidRequestError("field 'offsets' must be a list of [topic, queue, offset]")
        items = []
        for item in raw:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                    and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                            for v in item[1:])):
                raise InvalidRequestError("each offset must be [topic, queue_id, offset]")
            topic, queue_id, offset = item
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
        group = _field(body, "group", str)
        topic = _field(body, "topic", str)
        queue_id = _nonneg(body, "queue_id")
        return {"offset": self.b.state.offset_of(group, topic, queue_id)}

    # ----------------------------------------------------------- membership

    async def heartbeat(self, body: Any, conn: Connection) -> Any:
        from broker.server import monotonic_ms

        body = _map(body)
        group = _field(body, "group", str)
        client_id = _field(body, "client_id", str)
        if body.get("leave"):
            return {"left": self.b.members.leave(group, client_id)}
        subs = body.get("subscriptions", {})
        if not isinstance(subs, dict):
            raise InvalidRequestError("field 'subscriptions' must map topic -> tag expression")
        mode = body.get("mode", "clustering")
        self.b.members.heartbeat(group, client_id, subs, str(mode), monotonic_ms())
        return {}

    async def members(self, body: Any, conn: Connection) -> Any:
        from broker.server import monotonic_ms

        group = _field(_map(body), "group", str)
        return {"members": self.b.members.members(group, monotonic_ms())}

    async def status(self, body: Any, conn: Connection) -> Any:
        from broker.server import monotonic_ms

        info = self.b.status()
        info["groups"] = self.b.members.describe(monotonic_ms())
        return info


def handlers_for(broker: Broker) -> dict[int, Handler]:
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
    }



