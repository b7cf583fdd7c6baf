"""The workload: producers at a set rate, a consumer group, and the final drain.

Every message has a unique integer `value`; its body is that integer in
decimal, a colon, and filler derived from the value (`body_of`), so a body
can be damaged without its value changing. The CRC32C of the body
(`body_crc32c`, the format's own checksum, which the audit can compute from
the replicas' files without this code) is recorded with the send when it is
invoked and with every read, so the checker and the audit compare what was
read or stored with what was sent, byte for byte. Each producer
worker owns one client `Producer` and sends one message at a time, so the
idempotence sequence the client assigns is this worker's own counter, which
is recorded with every send (the audit matches messages by producer id and
sequence). A send that ends in an error is `info` (it may have been stored:
the client retries internally, and an earlier attempt may have landed), and
the worker continues as a fresh process id, as Jepsen retires a process after
an indeterminate op; only errors the broker gives before storing anything
(unknown topic, too large, no permission, invalid request) on a single
attempt are `fail`.

Consumers are client `PushConsumer`s in one group (clustering mode,
committing offsets); each delivered message is a `poll` ok op carrying the
consumer's rebalance count, so the checker can tell a rebalance reset from a
backwards step. The drain, after the faults are healed, reads every queue
from offset 0 with a fresh `PullConsumer` until nothing new arrives.

With retention on, a read below a queue's first retained message is
answered "moved forward" (OFFSET_MOVED). Every such jump a reader makes is a
`moved` ok op: `{"topic", "group", "queue", "from", "to", "min_offset",
"drain"}`, recorded when the reader learns it (so with its time), meaning
"offsets [from, to) of this queue were answered as deleted". The drain runs
with `on_offset_moved="error"` and continues itself, so its `to` is exactly
the `min_offset` the broker answered. The consumers keep the client's
default ("earliest": the client continues by itself and only says
`moved_from` in the pull's result); the workload wraps each consumer's
pulls to record it, with `to` = the first offset that pull returned (or its
`next_offset` when it returned nothing), the offset the client continued
from. The checker (chaos.checker) counts an acknowledged message that was
not read as `expired` only when the reads that passed its offset were such
jumps.

In a secured run (chaos.security) the producers, consumers and the drain
authenticate over TLS as the run's ACL user, which may publish and subscribe
to the run's topic and its two groups and nothing else; the topic and the
user are created by the bootstrap admin.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from chaos.history import History
from chaos.security import OPEN, ClientSecurity, put_user, workload_user
from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    InvalidRequestError,
    MessageTooLargeError,
    NoPermissionError,
    OffsetMovedError,
    UnknownTopicError,
)
from ledgermq.client import Producer, PullConsumer, PushConsumer
from ledgermq.client.model import MessageQueue, PullResult, ReceivedMessage
from ledgermq.wire import RpcClient

DEFINITE_FAILURES = (UnknownTopicError, MessageTooLargeError, NoPermissionError,
                     InvalidRequestError)
CONSUMER_PROCESS_BASE = 1000
DRAIN_PROCESS = 2000
DRAIN_GROUP = "chaos-drain"


@dataclass(frozen=True)
class WorkloadSpec:
    topic: str = "chaos"
    queues: int = 4
    rate: float = 50.0  # sends per second, all producers together
    producers: int = 4
    consumers: int = 2
    group: str = "chaos-consumers"
    send_timeout: float = 2.0
    retry_timeout: float = 5.0
    body_bytes: int = 48  # filler after "<value>:" in each body
    coalesce: bool = True  # the producers' client-side merging (Producer's `coalesce`)


def body_of(value: int, filler: int = 48) -> bytes:
    """The body sent for `value`: `b"<value>:"` then `filler` bytes derived from it."""
    seed = hashlib.blake2b(str(value).encode(), digest_size=32).hexdigest().encode()
    return str(value).encode() + b":" + (seed * (filler // len(seed) + 1))[:filler]


def body_digest(body: bytes) -> int:
    """What the history records of a body: its CRC32C (as docs/chaos.md says)."""
    return crc32c.crc32c(body)


def value_of(body: bytes) -> int | str:
    """The value a body carries (the text before the first colon); a foreign body
    stays text, so the checker reports it as unexpected."""
    head = body.split(b":", 1)[0]
    try:
        return int(head)
    except ValueError:
        return body.decode(errors="replace")


async def node_status(address: str, timeout: float = 1.0,
                      security: ClientSecurity = OPEN) -> dict[str, Any] | None:
    """A node's BROKER_STATUS, None if it does not answer in time."""
    try:
        host, port = split_host_port(address)
        async with asyncio.timeout(timeout):
            client = await RpcClient.connect(host, port, role="admin", timeout=timeout,
                                             **security.as_admin())
    except Exception:
        return None
    try:
        async with asyncio.timeout(timeout):
            status: dict[str, Any] = await client.request(RequestCode.BROKER_STATUS, None)
            return status
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            await client.close()


async def find_leader(addresses: dict[int, str],
                      security: ClientSecurity = OPEN) -> int | None:
    """The ready leader with the highest term among the nodes that answer."""
    statuses = await asyncio.gather(*(node_status(a, security=security)
                                      for a in addresses.values()))
    best: tuple[int, int] | None = None
    for node, status in zip(addresses, statuses, strict=True):
        if status and status.get("role") == "leader" and status.get("leader_ready"):
            term = int(status.get("term", 0))
            if best is None or term > best[0]:
                best = (term, node)
    return best[1] if best else None


async def wait_leader(addresses: dict[int, str], timeout: float,
                      security: ClientSecurity = OPEN) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = await find_leader(addresses, security)
        if leader is not None:
            return leader
        await asyncio.sleep(0.2)
    return None


class Workload:
    def __init__(self, spec: WorkloadSpec, namesrv: str, history: History,
                 security: ClientSecurity = OPEN,
                 node_addresses: Sequence[str] = ()) -> None:
        """`security`: a secured run's credentials and CA; the workload's
        clients then run as its ACL user, created by `setup` on the leader
        among `node_addresses`."""
        self.spec = spec
        self.namesrv = namesrv
        self.security = security
        self.node_addresses = list(node_addresses)
        self.history = history
        self._values = itertools.count(1)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._consumers: list[PushConsumer] = []
        self.acked = 0
        self.moves = 0  # "moved forward" jumps recorded (consumers and drain)
        self.acl_user: dict[str, Any] | None = None  # secured runs: the workload's user

    async def setup(self, timeout: float = 60.0) -> None:
        """Create the topic (retrying until a leader takes it); in a secured
        run as the admin, then the workload's ACL user."""
        producer = Producer([self.namesrv], retry_timeout=timeout, name="chaos-setup",
                            credentials=self.security.admin, tls=self.security.tls)
        try:
            await producer.create_topic(self.spec.topic, queues=self.spec.queues)
        finally:
            await producer.close()
        if self.security.secure:
            assert self.security.user is not None
            reply = await put_user(self.node_addresses, self.security, workload_user(
                self.spec.topic, (self.spec.group, DRAIN_GROUP), self.security.user.secret),
                timeout)
            # What the broker recorded (never the secret): evidence in results.json.
            self.acl_user = reply.get("user")

    async def start(self) -> None:
        for i in range(self.spec.consumers):
            await self._start_consumer(i)
        for i in range(self.spec.producers):
            self._tasks.append(asyncio.create_task(self._producer(i)))

    async def stop_producers(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop_consumers(self) -> None:
        for consumer in self._consumers:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(30):
                    await consumer.stop()

    # ------------------------------------------------------------ producers

    async def _producer(self, worker: int) -> None:
        spec = self.spec
        producer = Producer([self.namesrv], send_timeout=spec.send_timeout,
                            retry_timeout=spec.retry_timeout, name=f"chaos-producer-{worker}",
                            coalesce=spec.coalesce, **self.security.as_user())
        process = worker
        sequence = 0
        interval = spec.producers / spec.rate
        next_at = time.monotonic() + interval * worker / spec.producers
        try:
            while not self._stop.is_set():
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                next_at = max(next_at + interval, time.monotonic())
                if self._stop.is_set():
                    break
                value = next(self._values)
                sequence += 1
                body = body_of(value, spec.body_bytes)
                base = {"topic": spec.topic, "value": value,
                        "producer_id": producer.producer_id, "sequence": sequence,
                        "body_crc32c": body_digest(body), "body_len": len(body)}
                self.history.record(process, "invoke", "send", dict(base))
                retries = producer.retries
                try:
                    result = await producer.send(spec.topic, body)
                except asyncio.CancelledError:
                    self.history.record(process, "info", "send", dict(base),
                                        error="cancelled")
                    raise
                except Exception as exc:
                    attempts = producer.retries - retries + 1
                    definite = isinstance(exc, DEFINITE_FAILURES) and attempts == 1
                    self.history.record(process, "fail" if definite else "info", "send",
                                        dict(base, attempts=attempts),
                                        error=f"{type(exc).__name__}: {exc}")
                    if not definite:
                        process += spec.producers  # retire the process (Jepsen's rule)
                    continue
                self.acked += 1
                self.history.record(process, "ok", "send", dict(
                    base, attempts=producer.retries - retries + 1, group=result.queue.group,
                    queue=result.queue.queue_id, offset=result.queue_offset,
                    msg_id=result.msg_id, duplicate=result.duplicate))
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await producer.close()

    # ------------------------------------------------------------ consumers

    async def _start_consumer(self, index: int) -> None:
        process = CONSUMER_PROCESS_BASE + index
        holder: list[PushConsumer] = []

        def on_message(message: ReceivedMessage) -> None:
            epoch = holder[0].rebalances if holder else 0
            self.history.record(process, "ok", "poll", {
                "epoch": epoch, "messages": [message_record(message)]})

        consumer = PushConsumer([self.namesrv], self.spec.group, self.spec.topic, on_message,
                                client_id=f"chaos-consumer-{index}", long_poll_ms=500,
                                batch_size=64, **self.security.as_user())
        self._record_moves(consumer.puller, process)
        holder.append(consumer)
        deadline = time.monotonic() + 60
        while True:
            try:
                await consumer.start()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        self._consumers.append(consumer)

    def _record_moves(self, puller: PullConsumer, process: int) -> None:
        """Record every "moved forward" jump of `puller`'s pulls as a `moved` op.

        The client continues past a deleted offset by itself and tells only
        the pull's caller (`PullResult.moved_from`); the PushConsumer that
        calls it has no hook for that, so its puller's `pull` is wrapped here.
        The wrapper changes nothing in what the pull does or returns."""
        pull = puller.pull

        async def recording_pull(mq: MessageQueue, offset: int, *args: Any,
                                 **kwargs: Any) -> PullResult:
            result = await pull(mq, offset, *args, **kwargs)
            if result.moved_from is not None:
                to = result.messages[0].queue_offset if result.messages else result.next_offset
                self.record_moved(process, mq, result.moved_from, to, result.min_offset,
                                  drain=False)
            return result

        puller.pull = recording_pull  # type: ignore[method-assign]

    def record_moved(self, process: int, mq: MessageQueue, start: int, to: int,
                     min_offset: int | None, *, drain: bool) -> None:
        """Offsets [start, to) of `mq` were answered "moved forward" to this reader."""
        self.moves += 1
        self.history.record(process, "ok", "moved", {
            "topic": mq.topic, "group": mq.group, "queue": mq.queue_id, "from": start,
            "to": to, "min_offset": min_offset, "drain": drain})

    # ------------------------------------------------------------ drain

    async def drain(self, timeout: float = 90.0, quiet_passes: int = 3) -> int:
        """Read every queue from offset 0 until `quiet_passes` passes find nothing new.

        A queue whose start was deleted by retention is answered "moved
        forward": the drain records the jump and continues from the
        `min_offset` the broker named."""
        puller = PullConsumer([self.namesrv], DRAIN_GROUP, timeout=3.0, name="chaos-drain",
                              on_offset_moved="error", **self.security.as_user())
        deadline = time.monotonic() + timeout
        next_offset: dict[MessageQueue, int] = {}
        total = 0
        quiet = 0
        try:
            while time.monotonic() < deadline and quiet < quiet_passes:
                new = 0
                try:
                    queues = await puller.queues(self.spec.topic, refresh=True)
                except Exception:
                    await asyncio.sleep(0.5)
                    continue
                for mq in queues:
                    new += await self._drain_queue(puller, mq, next_offset, deadline)
                total += new
                quiet = quiet + 1 if new == 0 else 0
                if quiet < quiet_passes:
                    await asyncio.sleep(0.5)
        finally:
            await puller.close()
        return total

    async def _drain_queue(self, puller: PullConsumer, mq: MessageQueue,
                           next_offset: dict[MessageQueue, int], deadline: float) -> int:
        got = 0
        while time.monotonic() < deadline:
            offset = next_offset.get(mq, 0)
            try:
                result = await puller.pull(mq, offset, 256)
            except OffsetMovedError as exc:
                lo = exc.min_offset
                if lo is None or lo <= offset:
                    return got  # not a jump forward: nothing to continue from
                self.record_moved(DRAIN_PROCESS, mq, offset, lo, lo, drain=True)
                next_offset[mq] = lo
                continue
            except Exception:
                return got
            if result.messages:
                self.history.record(DRAIN_PROCESS, "ok", "poll", {
                    "drain": True, "messages": [message_record(m) for m in result.messages]})
                got += len(result.messages)
            if result.next_offset <= offset:
                return got
            next_offset[mq] = result.next_offset
            if not result.messages and result.next_offset >= result.max_offset:
                return got
        return got


def message_record(message: ReceivedMessage) -> dict[str, Any]:
    """A read message as the history records it, with the digest of the body read."""
    return {"topic": message.topic, "queue": message.queue_id, "offset": message.queue_offset,
            "msg_id": message.msg_id, "group": message.group,
            "producer_id": message.producer_id, "sequence": message.sequence,
            "value": value_of(message.body), "body_crc32c": body_digest(message.body),
            "body_len": len(message.body)}


def addresses_of(nodes: Sequence[int], address: Any) -> dict[int, str]:
    return {n: address(n) for n in nodes}
