"""The producer: send, send_async, send_oneway and send_batch, with retries.

Queue selection is round robin over every writable queue of the topic, or by
a hash of `sharding_key` when the order of related messages matters (same key
-> same queue). A failed attempt is retried until `retry_timeout`:

- NOT_LEADER with a hint: at once, at the named leader (unless that node
  failed during this send: the hint is stale; a node that failed before the
  send began may have restarted and been elected since, so it is tried);
- no leader yet, a broken connection, a timeout, OUTCOME_UNKNOWN: after a short
  fixed poll (10 ms, jittered), asking the group's nodes in turn, on another
  queue (unless a sharding key pins the queue), with a fresh route from the
  NameServer at most every 0.25 s. During a failover the nodes hold a write
  while no leader is known, or until a new leader has applied its first
  entry (the broker's `write_hold_ms`), and then answer with the new leader
  or take it: the SDK learns of the new leader when the group does, and the
  poll only bridges the moments before the survivors notice the old one died;
- UNKNOWN_TOPIC, MESSAGE_TOO_LARGE, NO_PERMISSION, INVALID_REQUEST: never.

Concurrent sends to one broker share requests (`client.coalesce`), so many
in-flight `send` calls cost a few round trips, not one each. `coalesce=False`
switches that off: every `send` is a request of its own, all of them in
flight at once, as other systems' clients send (the broker's group commit
still puts concurrent requests into one Raft entry).

Cost per message is what limits a Python producer, so the common case is kept
short: while the topic's route is cached, `send` of a plain body picks its
queue from per-route slots (queue, route, key, pre-packed head parts), packs
the record head with one struct call straight into the request being built,
and awaits nothing but the reply; its result is located from the reply's
O(1) fields (`stored_result`, message id formatted on first read). Anything
else (no cached route, a Message with tags/keys/properties, a pinned queue, a
failed first attempt) takes `_send`, with the same retry rules. `send_batch`
of plain bodies of one size encodes as one join.

Idempotence: every message gets (producer_id, sequence) on its first attempt
and keeps it across retries, so a retry of a send whose first attempt was
stored (but whose answer was lost) returns the stored result instead of
storing it twice (see docs/broker.md for the broker's window).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import secrets
import socket
import ssl
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    InvalidRequestError,
    LedgerMQError,
    NotLeaderError,
    OutcomeUnknownError,
    RequestTimeoutError,
    ServiceUnavailableError,
    UnknownTopicError,
)
from ledgermq.base.message_record import encode_properties
from ledgermq.client.coalesce import UNLIMITED_INFLIGHT, Outcome, SendCoalescer
from ledgermq.client.model import Message, MessageQueue, SendResult, stored_result
from ledgermq.client.records import (
    HEAD,
    HEAD_SIZE,
    SEQUENCE_AT,
    check_tags_and_keys,
    encode_record,
)
from ledgermq.client.routes import PERM_WRITE, RETRIABLE, Cluster, GroupRoute
from ledgermq.wire.auth import Credentials

log = logging.getLogger(__name__)

_RETRY_LATER = (*RETRIABLE, ServiceUnavailableError, OutcomeUnknownError)
# Retries that wait (no leader known yet, a broken connection): every 10 ms,
# +-20% jitter, never longer (a doubling back-off quantised the failover
# time to its steps); the route is asked of the NameServer again at most
# this often meanwhile (it learns of a new leader from its registration,
# later than the nodes' answers name it).
RETRY_POLL_S = 0.01
ROUTE_REFRESH_S = 0.25
_pack_head = HEAD.pack
_monotonic = time.monotonic
_time_ns = time.time_ns
_get_running_loop = asyncio.get_running_loop
_pack_sequence_into = struct.Struct("<Q").pack_into
_PLAIN = {bytes}


def _plain(messages: Sequence[bytes | Message]) -> TypeGuard[Sequence[bytes]]:
    """Whether every message is a plain body (no tags, keys or properties)."""
    return set(map(type, messages)) == _PLAIN


# Where a send goes, precomputed per queue of a route: (queue, its group's
# route, (topic, queue id), topic as bytes, topic + born host as bytes, and
# what packs a plain body's head with them: see _slots).
Slot = tuple[MessageQueue, GroupRoute, tuple[str, int], bytes, bytes,
             Callable[..., bytes], bytes, bytes]


class Producer:
    def __init__(
        self,
        namesrv: Sequence[str],
        *,
        idempotent: bool = True,
        send_timeout: float = 3.0,
        retry_timeout: float = 15.0,
        name: str = "producer",
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
        coalesce: bool = True,
    ) -> None:
        """`credentials`: authenticate to the brokers (docs/security.md;
        `credentials_from_env()` reads them from the environment); `tls`:
        connect with TLS, verifying the servers' certificates; `coalesce`:
        concurrent sends to one broker share requests (False: one request
        per send, no limit on requests in flight)."""
        self.cluster = Cluster(tuple(namesrv), name=name, timeout=send_timeout,
                               credentials=credentials, tls=tls)
        self.send_timeout = send_timeout
        self.retry_timeout = retry_timeout
        self.producer_id = secrets.randbits(63) | 1 if idempotent else 0
        self._sequence = 1  # the next one to hand out
        self._round_robin = 0
        self._background: set[asyncio.Task[Any]] = set()
        self.born_host = f"{socket.gethostname()}:0"
        self._host = self.born_host.encode()
        self._store_pid = struct.pack("<qQ", 0, self.producer_id)  # store_ms 0, producer id
        # topic -> (the route's groups the slots were built from, the slots)
        self._plans: dict[str, tuple[list[GroupRoute], list[Slot]]] = {}
        self.retries = 0
        self._jitter = random.Random()
        self.coalescer = (SendCoalescer(self._send_request) if coalesce else
                          SendCoalescer(self._send_request, max_messages=1,
                                        max_inflight=UNLIMITED_INFLIGHT))

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
        cluster = self.cluster
        plan = self._plans.get(topic)
        cached = cluster._routes.get(topic)  # Cluster.cached_route, inlined
        if (plan is not None and queue is None and type(body) is bytes
                and not (tags or keys or properties) and cached is not None
                and plan[0] is cached[1] and started - cached[0] < cluster.route_ttl):
            # The common case, with nothing awaited but the reply: the route
            # is cached, the message a plain body, encoded straight into the
            # request being built for the group's leader.
            slots = plan[1]
            if sharding_key is None:
                n = self._round_robin
                self._round_robin = n + 1
                slot = slots[n % len(slots)]
            else:
                slot = slots[zlib.crc32(sharding_key.encode()) % len(slots)]
            mq, route, key, _, topic_host, pack_head, c1, c3 = slot
            group = route.group
            pid = self.producer_id
            if pid:
                sequence = self._sequence
                self._sequence = sequence + 1
            else:
                sequence = 0
            address = (None if cluster._suspects
                       else cluster._hints.get(group) or route.leader)
            if not address:
                address = cluster.leader_address(route)
            try:
                head = pack_head(HEAD_SIZE + len(topic_host) + len(body), c1,
                                 _time_ns() // 1_000_000, self._store_pid, sequence, c3,
                                 len(body), topic_host)
            except struct.error as exc:
                raise InvalidRequestError(f"message cannot be encoded: {exc}") from None
            coalescer = self.coalescer
            try:
                if coalescer.merges:
                    placed = await coalescer.send_one(address, group, key, head, body)
                else:
                    placed = await coalescer.send_alone(address, head + body)
            except Exception as exc:
                results = await self._send(topic, [body], sharding_key, None, timeout,
                                           sequence=sequence, started=started,
                                           failed=(exc, slot, address))
                return results[0]
            (base, offsets, listed, _), start, first, index, rank = placed
            if listed is not None:
                return self._listed(listed, first, 1, mq, group)[0]
            assert base is not None  # `_check` refused a reply with neither results nor base
            return stored_result(group, base + start, mq,
                                 None if offsets is None else offsets[index] + rank)
        first_slot = (None if queue is not None
                      else self._cached_slot(topic, sharding_key, started))
        message = body if isinstance(body, Message) else Message(
            body, tags=tags, keys=keys, properties=dict(properties or {}))
        results = await self._send(topic, [message], sharding_key, queue, timeout,
                                   slot=first_slot, started=started)
        return results[0]

    async def send_batch(self, topic: str, messages: Sequence[bytes | Message], *,
                         sharding_key: str | None = None, queue: MessageQueue | None = None,
                         timeout: float | None = None) -> list[SendResult]:
        """Send messages as one request (one entry on the broker), all to one queue."""
        if type(messages) is not list and type(messages) is not tuple:
            messages = list(messages)
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
        slots = [self._slot(MessageQueue(topic, g.group, q), g) for g in usable
                 for q in range(g.queues)]
        self._plans[topic] = (groups, slots)
        return slots

    def _slot(self, mq: MessageQueue, route: GroupRoute) -> Slot:
        topic_bytes = mq.topic.encode()
        topic_host = topic_bytes + self._host
        # A plain body's head (client.records.HEAD) and the topic and host that
        # follow it, packed in one call: size, (queue id, flag, sys flag),
        # born_ms, (store_ms, producer id), sequence, (reconsume times and the
        # lengths of topic, tags, keys, host, properties), body length, topic
        # and host.
        pack_head = struct.Struct(f"<I12sq16sQ16sI{len(topic_host)}s").pack
        return (mq, route, (mq.topic, mq.queue_id), topic_bytes, topic_host, pack_head,
                struct.pack("<III", mq.queue_id, 0, 0),
                struct.pack("<IHHHHI", 0, len(topic_bytes), 0, 0, len(self._host), 0))

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
        if queue is not None:
            route = next((g for g in groups if g.group == queue.group), None)
            if route is None:
                raise UnknownTopicError(f"group {queue.group} does not serve {topic!r}")
            return self._slot(queue, route)
        return self._pick(self._slots(topic, groups), sharding_key)

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
                 ) -> tuple[asyncio.Future[Outcome], int, Sequence[int], tuple[int, int, int]]:
        """Encode `messages` (sequences from `sequence` on) into the request
        being built for `address`; returns the future of its outcome, the first
        record's byte position, every record's position, and where the records
        are in the request (`Batch.add`)."""
        mq, _, key, topic, topic_host = slot[:5]
        queue_id = mq.queue_id
        host = self._host
        pid = self.producer_id
        lt, lh = len(topic), len(host)
        fixed = HEAD_SIZE + lt + lh
        n = len(messages)
        now = _time_ns() // 1_000_000
        bodies = messages if _plain(messages) and len(set(map(len, messages))) == 1 else None
        uniform = bodies is not None
        try:
            if bodies is not None:
                # Plain bodies of one size (the usual batch): the heads differ
                # only in the sequence, so the records are one join, with the
                # sequences patched in afterwards.
                size = fixed + len(bodies[0])
                head = _pack_head(size, queue_id, 0, 0, now, 0, pid, 0, 0, lt, 0, 0, lh, 0,
                                  size - fixed) + topic_host
                blob = head.join(bodies)
                nbytes = n * size
            else:
                parts: list[bytes] = []
                append = parts.append
                sizes = []
                step = 1 if pid else 0
                for m in messages:
                    if type(m) is bytes:
                        size = fixed + len(m)
                        append(_pack_head(size, queue_id, 0, 0, now, 0, pid, sequence, 0,
                                          lt, 0, 0, lh, 0, len(m)))
                        append(topic_host)
                        append(m)
                    else:
                        if not isinstance(m, Message):
                            m = Message(m)
                        body = m.body
                        if type(body) is not bytes:
                            body = body.encode() if isinstance(body, str) else bytes(body)
                        tags = m.tags.encode()
                        keys = m.keys.encode()
                        check_tags_and_keys(tags, keys)
                        props = encode_properties(m.properties) if m.properties else b""
                        size = fixed + len(tags) + len(keys) + len(props) + len(body)
                        append(_pack_head(size, queue_id, m.flag, 0, now, 0, pid, sequence, 0,
                                          lt, len(tags), len(keys), lh, len(props),
                                          len(body)))
                        append(topic)
                        append(tags)
                        append(keys)
                        append(host)
                        append(props)
                        append(body)
                    sizes.append(size)
                    sequence += step
                blob = b"".join(parts)
                nbytes = len(blob)
        except (ValueError, TypeError, struct.error) as exc:
            raise InvalidRequestError(f"message cannot be encoded: {exc}") from None
        future: asyncio.Future[Outcome] = _get_running_loop().create_future()
        batch = self.coalescer.open(address, group, nbytes, n)
        buf = batch.buf
        start = len(buf)
        positions: Sequence[int]
        if uniform:
            buf += head
            buf += blob
            positions = range(start, start + nbytes, size)
            if pid:
                for seq, at in enumerate(range(start + SEQUENCE_AT, start + nbytes, size),
                                         sequence):
                    _pack_sequence_into(buf, at, seq)
        else:
            buf += blob
            sizes.pop()
            positions = list(itertools.accumulate(sizes, initial=start))
        return future, start, positions, batch.add(future, key, start, n)

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
        base, offsets, listed, alone = await future
        if alone:
            first = index = rank = 0
        if listed is not None:
            return self._listed(listed, first, len(positions), mq, group)
        assert base is not None  # `_check` refused a reply with neither results nor base
        if alone:
            base -= start
        if offsets is None:
            return [stored_result(group, base + at, mq, None) for at in positions]
        offset = offsets[index] + rank
        return [stored_result(group, base + at, mq, offset + k)
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
        begun = started or _monotonic()
        deadline = begun + (timeout or self.retry_timeout)
        attempt = 0
        refresh = False
        refreshed_at = -ROUTE_REFRESH_S
        pinned = queue
        while True:
            if failed is not None:
                error, slot, address = failed
                failed = None
            else:
                if slot is None:
                    if refresh:
                        refreshed_at = _monotonic()
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
                # A hint naming a node that failed during this send is stale
                # (the answering node has not noticed the death yet); one
                # that failed before it is not: the node restarted since and
                # was elected (a 2 s suspicion held such a leader back).
                if (error.leader and error.leader != address
                        and not self.cluster.failed_since(error.leader, begun)):
                    self.cluster.trust_leader(route.group, error.leader)
                    refresh = False
                    self.retries += 1
                    if _monotonic() < deadline:
                        continue
                else:
                    self.cluster.forget_leader(route.group)
                    refresh = _monotonic() - refreshed_at >= ROUTE_REFRESH_S
            elif isinstance(error, _RETRY_LATER):
                self.cluster.forget_leader(route.group)
                refresh = _monotonic() - refreshed_at >= ROUTE_REFRESH_S
            elif isinstance(error, UnknownTopicError):
                # A route that outlived its topic; ask again once, then give up.
                if refresh:
                    raise error
                refresh = True
            else:
                raise error
            self.retries += 1
            if _monotonic() + RETRY_POLL_S >= deadline:
                if isinstance(error, LedgerMQError):
                    raise error
                raise RequestTimeoutError(
                    f"send to {topic!r} failed after {attempt} attempts: {error!r}") from error
            log.debug("send attempt %d to %s failed: %r", attempt, address, error)
            # A short fixed poll, not a back-off: during a failover the nodes
            # are asked in turn; a node that knows no leader holds the send
            # until it does and then names it (or takes the send as the new
            # leader), so the send lands as the new leader becomes ready (a
            # doubling to 300 ms quantised failover to about 0.6 or 0.9 s).
            # Jitter keeps many producers from polling in step.
            await asyncio.sleep(RETRY_POLL_S * (0.8 + 0.4 * self._jitter.random()))

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
