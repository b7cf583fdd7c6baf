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
import itertools
import logging
import secrets
import socket
import struct
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from client.coalesce import SendCoalescer
from client.model import Message, MessageQueue, SendResult
from client.records import encode_properties, encode_record
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
        self._sequence = itertools.count(1)
        self._round_robin = itertools.count()
        self._background: set[asyncio.Task[Any]] = set()
        self.born_host = f"{socket.gethostname()}:0"
        self._host = self.born_host.encode()
        self._queues: tuple[list[GroupRoute] | None, list[MessageQueue]] = (None, [])
        self._writable: tuple[list[GroupRoute] | None, list[GroupRoute]] = (None, [])
        self.retries = 0
        self.coalescer = SendCoalescer(self._send_request)

    async def _send_request(self, address: str, records: bytes, count: int) -> Any:
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
        message = body if isinstance(body, Message) else Message(
            body, tags=tags, keys=keys, properties=dict(properties or {}))
        results = await self._send(topic, [message], sharding_key, queue, timeout)
        return results[0]

    async def send_batch(self, topic: str, messages: Sequence[bytes | Message], *,
                         sharding_key: str | None = None, queue: MessageQueue | None = None,
                         timeout: float | None = None) -> list[SendResult]:
        """Send messages as one request (one entry on the broker), all to one queue."""
        batch = [m if isinstance(m, Message) else Message(m) for m in messages]
        if not batch:
            return []
        return await self._send(topic, batch, sharding_key, queue, timeout)

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
        route, mq = await self._select(topic, None, None, 0)
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
        return next(self._sequence) if self.producer_id else 0

    async def _routes(self, topic: str, refresh: bool) -> list[GroupRoute]:
        groups = await self.cluster.try_route(topic, refresh)
        cached_for, writable = self._writable
        if cached_for is groups:
            return writable
        writable = [g for g in groups if g.perm & PERM_WRITE]
        if writable:
            # Routes are cached objects: filter each once (and keep the list's
            # identity, which _select's queue list is cached on).
            self._writable = (groups, writable)
        if writable:
            return writable
        if groups:
            return groups  # the broker will answer NO_PERMISSION
        # Not routed yet: a broker that auto-creates topics creates it on the
        # first send; until the route appears only queue 0 is known to exist.
        return await self.cluster.any_group()

    async def _select(self, topic: str, sharding_key: str | None, queue: MessageQueue | None,
                      attempt: int, refresh: bool = False) -> tuple[GroupRoute, MessageQueue]:
        groups = await self._routes(topic, refresh)
        if not groups:
            raise UnknownTopicError(f"no broker group serves topic {topic!r}",
                                    data={"topic": topic})
        if queue is not None:
            route = next((g for g in groups if g.group == queue.group), None)
            if route is None:
                raise UnknownTopicError(f"group {queue.group} does not serve {topic!r}")
            return route, queue
        cached_for, queues = self._queues
        if cached_for is not groups:
            # Routes are cached objects: build their queue list once per route.
            queues = [MessageQueue(topic, g.group, q) for g in groups for q in range(g.queues)]
            self._queues = (groups, queues)
        if sharding_key is not None:
            mq = queues[zlib.crc32(sharding_key.encode()) % len(queues)]
        else:
            mq = queues[next(self._round_robin) % len(queues)]
        route = next(g for g in groups if g.group == mq.group)
        return route, mq

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

    async def _send(self, topic: str, messages: list[Message], sharding_key: str | None,
                    queue: MessageQueue | None, timeout: float | None) -> list[SendResult]:
        sequences = [self._next_sequence() for _ in messages]
        deadline = time.monotonic() + (timeout or self.retry_timeout)
        attempt = 0
        refresh = False
        pinned = queue
        backoff = 0.02
        while True:
            route, mq = await self._select(topic, sharding_key, pinned, attempt, refresh)
            if sharding_key is not None or queue is not None:
                pinned = mq  # ordering: retries stay on the same queue
            address = self.cluster.leader_address(route, attempt)
            attempt += 1
            try:
                key = (topic, mq.queue_id)
                results = await self.coalescer.submit(
                    address, route.group, self._records(mq, messages, sequences),
                    [key] * len(messages))
                return [SendResult(msg_id, mq if queue_id is None or queue_id == mq.queue_id
                                   else MessageQueue(topic, route.group, queue_id),
                                   queue_offset, duplicate)
                        for msg_id, queue_id, queue_offset, duplicate in results]
            except NotLeaderError as exc:
                error: BaseException = exc
                if (exc.leader and exc.leader != address
                        and not self.cluster.is_suspect(exc.leader)):
                    self.cluster.note_leader(route.group, exc.leader)
                    refresh = False
                    self.retries += 1
                    if time.monotonic() < deadline:
                        continue
                else:
                    self.cluster.forget_leader(route.group)
                    refresh = True
            except _RETRY_LATER as exc:
                error = exc
                self.cluster.forget_leader(route.group)
                refresh = True
            except UnknownTopicError as exc:
                # A route that outlived its topic; ask again once, then give up.
                error = exc
                if refresh:
                    raise
                refresh = True
            self.retries += 1
            if time.monotonic() + backoff >= deadline:
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
