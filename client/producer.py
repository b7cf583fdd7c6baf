"""The producer: send, send_async, send_oneway and send_batch, with retries.

Queue selection is round robin over every writable queue of the topic, or by
a hash of `sharding_key` when the order of related messages matters (same key
-> same queue). A failed attempt is retried until `retry_timeout`:

- NOT_LEADER with a hint: at once, at the named leader;
- no leader yet, a broken connection, a timeout, OUTCOME_UNKNOWN: after a short
  back-off, with a fresh route, on another queue (unless a sharding key pins
  the queue);
- UNKNOWN_TOPIC, MESSAGE_TOO_LARGE, NO_PERMISSION, INVALID_REQUEST: never.

Concurrent sends to one broker share requests (`client.coalesce`), so many
in-flight `send` calls cost a few round trips, not one each.

Idempotence: every message gets (producer_id, sequence) on its first attempt
and keeps it across retries, so a retry of a send whose first attempt was
stored (but whose answer was lost) returns the stored result instead of
storing it twice (see docs/broker.md for the broker's window).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from client.coalesce import Outcome, SendCoalescer
from client.model import Message, MessageQueue, SendResult
from client.records import HEAD, HEAD_SIZE, encode_properties, encode_record
from client.routes import PERM_WRITE, RETRIABLE, Cluster, GroupRoute
from ledgermq.codes import RequestCode
from ledgermq.errors import (
    InvalidRequestError,
    LedgerMQError,
    NotLeaderError,
    OutcomeUnknownError,
    RequestTimeoutError,
    ServiceUnavailableError,
    UnknownTopicError,
)

log = logging.getLogger(__name__)

_RETRY_LATER = (*RETRIABLE, ServiceUnavailableError, OutcomeUnknownError)
_pack_head = HEAD.pack
_new = object.__new__
_monotonic = time.monotonic
_time_ns = time.time_ns

# Where a send goes, precomputed per queue of a route: (queue, its group's
# route, (topic, queue id), topic as bytes, topic + born host as bytes).
Slot = tuple[MessageQueue, GroupRoute, tuple[str, int], bytes, bytes]


def _result(msg_id: str | None, queue: MessageQueue, queue_offset: int | None,
            duplicate: bool) -> SendResult:
    """SendResult(...) without the frozen dataclass's per-field setattr calls."""
    result = _new(SendResult)
    fields = result.__dict__
    fields["msg_id"] = msg_id
    fields["queue"] = queue
    fields["queue_offset"] = queue_offset
    fields["duplicate"] = duplicate
    return result


class Producer:
    def __init__(
        self,
        namesrv: Sequence[str],
        *,
        idempotent: bool = True,
        send_timeout: float = 3.0,
        retry_timeout: float = 15.0,
        name: str = "producer",
    ) -> None:
        self.cluster = Cluster(tuple(namesrv), name=name, timeout=send_timeout)
        self.send_timeout = send_timeout
        self.retry_timeout = retry_timeout
        self.producer_id = secrets.randbits(63) | 1 if idempotent else 0
        self._sequence = 1  # the next one to hand out
        self._round_robin = 0
        self._background: set[asyncio.Task[Any]] = set()
        self.born_host = f"{socket.gethostname()}:0"
        self._host = self.born_host.encode()
        # topic -> (the route's groups the slots were built from, the slots)
        self._plans: dict[str, tuple[list[GroupRoute], list[Slot]]] = {}
        self.retries = 0
        self.coalescer = SendCoalescer(self._send_request)

    async def _send_request(self, address: str, records: bytes | bytearray, count: int) -> Any:
        return await self.cluster.request(address, RequestCode.SEND_MESSAGES,
                                          {"records": records, "count": count},
                                          timeout=self.send_timeout)

    async def start(self) -> Producer:
        return self

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(list(self._background), timeout=self.retry_timeout)
        await self.cluster.close()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ API

    async def send(self, topic: str, body: bytes | Message, *, tags: str = "", keys: str = "",
                   properties: dict[str, str] | None = None, sharding_key: str | None = None,
                   queue: MessageQueue | None = None, timeout: float | None = None
                   ) -> SendResult:
        """Send one message and wait until the broker group acknowledges it."""
        started = _monotonic()
        slot = None if queue is not None else self._cached_slot(topic, sharding_key, started)
        if slot is None or type(body) is not bytes or tags or keys or properties:
            message = body if isinstance(body, Message) else Message(
                body, tags=tags, keys=keys, properties=dict(properties or {}))
            results = await self._send(topic, [message], sharding_key, queue, timeout,
                                       slot=slot, started=started)
            return results[0]
        # The common case, with nothing awaited but the reply: the route is
        # cached, the message is a plain body, encoded straight into the
        # request being built for the group's leader.
        mq, route, key, topic_bytes, topic_host = slot
        group = route.group
        pid = self.producer_id
        if pid:
            sequence = self._sequence
            self._sequence = sequence + 1
        else:
            sequence = 0
        address = self.cluster.leader_address(route)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        size = HEAD_SIZE + len(topic_host) + len(body)
        try:
            head = _pack_head(size, mq.queue_id, 0, 0, _time_ns() // 1_000_000, 0, pid,
                              sequence, 0, len(topic_bytes), 0, 0, len(self._host), 0,
                              len(body))
        except struct.error as exc:
            raise InvalidRequestError(f"message cannot be encoded: {exc}") from None
        batch = self.coalescer.open(address, group, size, 1)
        buf = batch.buf
        start = len(buf)
        buf += head
        buf += topic_host
        buf += body
        first, index, rank = batch.add(future, key, start, 1)
        try:
            reply, alone = await future
        except Exception as exc:
            results = await self._send(topic, [Message(body)], sharding_key, None, timeout,
                                       sequence=sequence, started=started,
                                       failed=(exc, slot, address))
            return results[0]
        if alone:
            first = index = rank = 0
            start = 0
        listed = reply.get("results")
        if listed is not None:
            return self._listed(listed, first, 1, mq, group)[0]
        offsets = reply.get("queue_offsets")
        return _result(f"{group}@{reply['base'] + start:016X}", mq,
                       None if offsets is None else offsets[index] + rank, False)

    async def send_batch(self, topic: str, messages: Sequence[bytes | Message], *,
                         sharding_key: str | None = None, queue: MessageQueue | None = None,
                         timeout: float | None = None) -> list[SendResult]:
        """Send messages as one request (one entry on the broker), all to one queue."""
        if not messages:
            return []
        started = _monotonic()
        slot = None if queue is not None else self._cached_slot(topic, sharding_key, started)
        return await self._send(topic, messages, sharding_key, queue, timeout, slot=slot,
                                started=started)

    def send_async(self, topic: str, body: bytes | Message, *,
                   callback: Callable[[SendResult | None, BaseException | None], None] | None
                   = None, **kwargs: Any) -> asyncio.Task[SendResult]:
        """Start a send; returns its task (await it, or pass `callback`)."""
        task = asyncio.create_task(self.send(topic, body, **kwargs))
        if callback is not None:
            def done(t: asyncio.Task[SendResult]) -> None:
                if t.cancelled():
                    callback(None, asyncio.CancelledError())
                elif t.exception() is not None:
                    callback(None, t.exception())
                else:
                    callback(t.result(), None)
            task.add_done_callback(done)
        return task

    async def send_oneway(self, topic: str, body: bytes | Message, **kwargs: Any) -> None:
        """Hand the message to the connection and return without waiting: no
        acknowledgement, no retry, no error reported. Cheapest, may lose it."""
        message = body if isinstance(body, Message) else Message(body, **kwargs)
        mq, route, *_ = await self._select(topic, None, None, False)
        records = self._records(mq, [message], [self._next_sequence()])
        address = self.cluster.leader_address(route)
        conn = await self.cluster.connection(address)
        task = asyncio.create_task(conn.request(RequestCode.SEND_MESSAGES,
                                                {"records": records[0], "count": 1}))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    # ------------------------------------------------------------- internals

    def _next_sequence(self) -> int:
        return self._take_sequences(1)

    def _take_sequences(self, n: int) -> int:
        """The first of `n` consecutive sequences (0 when not idempotent)."""
        if not self.producer_id:
            return 0
        first = self._sequence
        self._sequence = first + n
        return first

    def _slots(self, topic: str, groups: list[GroupRoute]) -> list[Slot]:
        """Every queue a send to `topic` may go to, given the route `groups`:
        those of the writable groups (or of all, if none is: the broker will
        answer NO_PERMISSION). Built once per route object."""
        plan = self._plans.get(topic)
        if plan is not None and plan[0] is groups:
            return plan[1]
        usable = [g for g in groups if g.perm & PERM_WRITE] or groups
        topic_bytes = topic.encode()
        topic_host = topic_bytes + self._host
        slots = [(MessageQueue(topic, g.group, q), g, (topic, q), topic_bytes, topic_host)
                 for g in usable for q in range(g.queues)]
        self._plans[topic] = (groups, slots)
        return slots

    def _pick(self, slots: list[Slot], sharding_key: str | None) -> Slot:
        if sharding_key is not None:
            return slots[zlib.crc32(sharding_key.encode()) % len(slots)]
        n = self._round_robin
        self._round_robin = n + 1
        return slots[n % len(slots)]

    def _cached_slot(self, topic: str, sharding_key: str | None, now: float) -> Slot | None:
        """The queue for a send without awaiting, if the route is cached and fresh."""
        groups = self.cluster.cached_route(topic, now)
        if not groups:
            return None
        plan = self._plans.get(topic)
        slots = plan[1] if plan is not None and plan[0] is groups else self._slots(topic, groups)
        if not slots:
            return None
        return self._pick(slots, sharding_key)

    async def _select(self, topic: str, sharding_key: str | None, queue: MessageQueue | None,
                      refresh: bool = False) -> Slot:
        groups = await self.cluster.try_route(topic, refresh)
        if not groups:
            # Not routed yet: a broker that auto-creates topics creates it on the
            # first send; until the route appears only queue 0 is known to exist.
            groups = await self.cluster.any_group()
        if not groups:
            raise UnknownTopicError(f"no broker group serves topic {topic!r}",
                                    data={"topic": topic})
        slots = self._slots(topic, groups)
        if queue is not None:
            route = next((g for g in groups if g.group == queue.group), None)
            if route is None:
                raise UnknownTopicError(f"group {queue.group} does not serve {topic!r}")
            topic_bytes = queue.topic.encode()
            return (queue, route, (queue.topic, queue.queue_id), topic_bytes,
                    topic_bytes + self._host)
        return self._pick(slots, sharding_key)

    def _records(self, mq: MessageQueue, messages: Sequence[Message],
                 sequences: Sequence[int]) -> list[bytes]:
        """Each message as its CommitLog record (client.records), for `mq`."""
        now = time.time_ns() // 1_000_000
        topic = mq.topic.encode()
        queue_id = mq.queue_id
        host = self._host
        pid = self.producer_id
        out = []
        for m, seq in zip(messages, sequences, strict=True):
            body = m.body
            if type(body) is not bytes:
                body = body.encode() if isinstance(body, str) else bytes(body)
            try:
                out.append(encode_record(topic, queue_id, body, m.tags.encode(),
                                         m.keys.encode(), host, encode_properties(m.properties)
                                         if m.properties else b"", m.flag, now, pid, seq))
            except (ValueError, struct.error) as exc:
                raise InvalidRequestError(f"message cannot be encoded: {exc}") from None
        return out

    def _enqueue(self, address: str, group: str, slot: Slot,
                 messages: Sequence[bytes | Message], sequence: int
                 ) -> tuple[asyncio.Future[Outcome], int, list[int], tuple[int, int, int]]:
        """Encode `messages` (sequences from `sequence` on) into the request
        being built for `address`; returns the future of its outcome, the first
        record's byte position, every record's position, and where the records
        are in the request (`Batch.add`)."""
        mq, _, key, topic, topic_host = slot
        queue_id = mq.queue_id
        host = self._host
        pid = self.producer_id
        step = 1 if pid else 0
        fixed = HEAD_SIZE + len(topic) + len(host)
        lt, lh = len(topic), len(host)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        nbytes = fixed * len(messages) + sum(
            len(m) if type(m) is bytes else len(getattr(m, "body", m)) for m in messages)
        batch = self.coalescer.open(address, group, nbytes, len(messages))
        buf = batch.buf
        start = len(buf)
        positions = []
        now = _time_ns() // 1_000_000
        try:
            for m in messages:
                positions.append(len(buf))
                if type(m) is bytes:
                    buf += _pack_head(fixed + len(m), queue_id, 0, 0, now, 0, pid, sequence, 0,
                                      lt, 0, 0, lh, 0, len(m))
                    buf += topic_host
                    buf += m
                else:
                    if not isinstance(m, Message):
                        m = Message(m)
                    body = m.body
                    if type(body) is not bytes:
                        body = body.encode() if isinstance(body, str) else bytes(body)
                    tags = m.tags.encode()
                    keys = m.keys.encode()
                    props = encode_properties(m.properties) if m.properties else b""
                    buf += _pack_head(fixed + len(tags) + len(keys) + len(props) + len(body),
                                      queue_id, m.flag, 0, now, 0, pid, sequence, 0, lt,
                                      len(tags), len(keys), lh, len(props), len(body))
                    buf += topic
                    buf += tags
                    buf += keys
                    buf += host
                    buf += props
                    buf += body
                sequence += step
        except (ValueError, TypeError, struct.error) as exc:
            del buf[start:]
            raise InvalidRequestError(f"message cannot be encoded: {exc}") from None
        return future, start, positions, batch.add(future, key, start, len(messages))

    @staticmethod
    def _listed(results: list[dict[str, Any]], first: int, n: int, mq: MessageQueue,
                group: str) -> list[SendResult]:
        """Results from a reply's per-message list (some were duplicates)."""
        out = []
        for r in results[first:first + n]:
            queue_id = r["queue_id"]
            out.append(SendResult(r["msg_id"], mq if queue_id is None or queue_id == mq.queue_id
                                  else MessageQueue(mq.topic, group, queue_id),
                                  r["queue_offset"], bool(r.get("duplicate"))))
        return out

    async def _attempt(self, address: str, slot: Slot, messages: Sequence[bytes | Message],
                       sequence: int) -> list[SendResult]:
        mq = slot[0]
        group = slot[1].group
        future, start, positions, (first, index, rank) = self._enqueue(
            address, group, slot, messages, sequence)
        reply, alone = await future
        if alone:
            first = index = rank = 0
            shift = start
        else:
            shift = 0
        listed = reply.get("results")
        if listed is not None:
            return self._listed(listed, first, len(positions), mq, group)
        base = reply["base"] - shift
        offsets = reply.get("queue_offsets")
        prefix = group + "@"
        if offsets is None:
            return [_result(f"{prefix}{base + at:016X}", mq, None, False) for at in positions]
        offset = offsets[index] + rank
        return [_result(f"{prefix}{base + at:016X}", mq, offset + k, False)
                for k, at in enumerate(positions)]

    async def _send(self, topic: str, messages: Sequence[bytes | Message],
                    sharding_key: str | None, queue: MessageQueue | None,
                    timeout: float | None, *, slot: Slot | None = None,
                    sequence: int | None = None, started: float | None = None,
                    failed: tuple[Exception, Slot, str] | None = None) -> list[SendResult]:
        """Send with retries. `slot`: where the first attempt goes (else
        selected here); `failed`: the first attempt was made by the caller and
        failed with (error, slot, address)."""
        if sequence is None:
            sequence = self._take_sequences(len(messages))
        deadline = (started or _monotonic()) + (timeout or self.retry_timeout)
        attempt = 0
        refresh = False
        pinned = queue
        backoff = 0.02
        while True:
            if failed is not None:
                error, slot, address = failed
                failed = None
            else:
                if slot is None:
                    slot = await self._select(topic, sharding_key, pinned, refresh)
                address = self.cluster.leader_address(slot[1], attempt)
                try:
                    return await self._attempt(address, slot, messages, sequence)
                except Exception as exc:
                    error = exc
            mq, route = slot[0], slot[1]
            slot = None
            if sharding_key is not None or queue is not None:
                pinned = mq  # ordering: retries stay on the same queue
            attempt += 1
            if isinstance(error, NotLeaderError):
                if (error.leader and error.leader != address
                        and not self.cluster.is_suspect(error.leader)):
                    self.cluster.note_leader(route.group, error.leader)
                    refresh = False
                    self.retries += 1
                    if _monotonic() < deadline:
                        continue
                else:
                    self.cluster.forget_leader(route.group)
                    refresh = True
            elif isinstance(error, _RETRY_LATER):
                self.cluster.forget_leader(route.group)
                refresh = True
            elif isinstance(error, UnknownTopicError):
                # A route that outlived its topic; ask again once, then give up.
                if refresh:
                    raise error
                refresh = True
            else:
                raise error
            self.retries += 1
            if _monotonic() + backoff >= deadline:
                if isinstance(error, LedgerMQError):
                    raise error
                raise RequestTimeoutError(
                    f"send to {topic!r} failed after {attempt} attempts: {error!r}") from error
            log.debug("send attempt %d to %s failed: %r", attempt, address, error)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 0.3)

    async def create_topic(self, topic: str, queues: int = 4, perm: int = 6) -> dict[str, Any]:
        """Create or update a topic on every broker group (admin helper)."""
        groups = await self.cluster.try_route(topic) or await self.cluster.any_group()
        result: dict[str, Any] = {}
        for route in groups:
            result = await self._admin(route, RequestCode.CREATE_TOPIC,
                                       {"topic": topic, "queues": queues, "perm": perm})
        return result

    async def _admin(self, route: GroupRoute, code: int, body: Any) -> Any:
        deadline = time.monotonic() + self.retry_timeout
        attempt = 0
        while True:
            address = self.cluster.leader_address(route, attempt)
            attempt += 1
            try:
                return await self.cluster.request(address, code, body)
            except NotLeaderError as exc:
                self.cluster.note_leader(route.group, exc.leader)
                if not exc.leader:
                    self.cluster.forget_leader(route.group)
                if time.monotonic() > deadline:
                    raise
            except _RETRY_LATER:
                self.cluster.forget_leader(route.group)
                if time.monotonic() > deadline:
                    raise
            with contextlib.suppress(Exception):
                await asyncio.sleep(0.05)
