"""Consumers: PullConsumer (the caller drives) and PushConsumer (a long-poll
loop per queue calling the user's callback).

PushConsumer delivery is at least once: a queue's offset is committed only
past messages whose callback returned. A callback that raises is retried in
memory (`reconsume_times` counts the attempts, with back-off) up to
`max_reconsume_times`; after that the message is handed to `on_give_up` and
skipped, so one poison message cannot stall its queue for ever. Retrying in
place keeps per-queue order (a `%RETRY%` topic would not); the cost is that a
failing message holds up the rest of its queue while it is retried.

Clustering mode shares the topic's queues among the group's live members
(heartbeats to every node of every group serving the topic; allocation by
sorted member ids, `client.allocate`), re-checked every `rebalance_interval`.
Broadcasting mode gives every member every queue with offsets in a local file.

A pull below the first message a queue still holds (retention deleted the
rest) is answered OFFSET_MOVED. With `on_offset_moved="earliest"` (the
default) the consumer logs it, counts it (`offsets_moved`) and continues from
the oldest retained message; with `"error"` the pull raises OffsetMovedError
(a PushConsumer stops consuming that queue and keeps the error in
`failures`), for applications that must not skip messages silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import ssl
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from commitlog.message import GROUP_NAME_MAX, TOPIC_LENGTH_MAX, valid_group, valid_topic
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    LedgerMQError,
    NotLeaderError,
    OffsetMovedError,
    OffsetOutOfRangeError,
    OutcomeUnknownError,
    ServiceUnavailableError,
)
from ledgermq.base.tasks import cancel_and_wait
from ledgermq.client.allocate import allocate_averagely
from ledgermq.client.model import MessageQueue, PullResult, ReceivedMessage
from ledgermq.client.offset_store import LocalOffsetStore, RemoteOffsetStore
from ledgermq.client.routes import PERM_READ, RETRIABLE, Cluster
from ledgermq.wire.auth import Credentials

log = logging.getLogger(__name__)

Callback = Callable[[ReceivedMessage], Awaitable[None] | None]
ON_OFFSET_MOVED = ("earliest", "error")


def _moved(exc: OffsetOutOfRangeError | OffsetMovedError, offset: int
           ) -> OffsetMovedError | None:
    """The OffsetMovedError an answer means, or None. Brokers before
    OFFSET_MOVED answered a pull below the range OFFSET_OUT_OF_RANGE."""
    if isinstance(exc, OffsetMovedError):
        return exc
    data = exc.data if isinstance(exc.data, dict) else {}
    lo = data.get("min_offset")
    if isinstance(lo, int) and offset < lo:
        return OffsetMovedError(exc.message, data={**data, "requested": offset})
    return None


class PullConsumer:
    """Explicit pulls and offset bookkeeping; the building block of PushConsumer."""

    def __init__(self, namesrv: Sequence[str], group: str, *, timeout: float = 5.0,
                 name: str = "consumer", credentials: Credentials | None = None,
                 tls: ssl.SSLContext | None = None,
                 on_offset_moved: str = "earliest") -> None:
        """`credentials`, `tls`: as for Producer (docs/security.md).
        `on_offset_moved`: what a pull below the queue's first retained
        message does: "earliest" continues from it, "error" raises
        OffsetMovedError (see the module's docstring)."""
        if on_offset_moved not in ON_OFFSET_MOVED:
            raise ValueError(f"on_offset_moved must be one of {ON_OFFSET_MOVED}")
        # The brokers refuse a malformed name on every request, which a
        # PushConsumer retries forever: refused here, once, instead.
        if not valid_group(group):
            raise ValueError(f"invalid consumer group name {group[:200]!r}: 1-{GROUP_NAME_MAX}"
                             " characters of [A-Za-z0-9_%|-]")
        self.group = group
        self.name = name
        self.on_offset_moved = on_offset_moved
        self.offsets_moved = 0  # pulls that found their offset deleted by retention
        self.cluster = Cluster(tuple(namesrv), name=name, timeout=timeout,
                               credentials=credentials, tls=tls)

    async def close(self) -> None:
        await self.cluster.close()

    async def queues(self, topic: str, refresh: bool = False) -> list[MessageQueue]:
        return await self.cluster.queues(topic, PERM_READ, refresh)

    async def _on_group(self, mq: MessageQueue, code: int, body: Any, *, leader: bool,
                        timeout: float | None = None) -> Any:
        """Send to the group's leader (writes) or any node (reads), failing over."""
        last: BaseException | None = None
        for attempt in range(12):
            route = self.cluster.group_route(mq.topic, mq.group)
            if route is None or attempt:
                routes = await self.cluster.try_route(mq.topic, refresh=attempt > 0)
                route = next((g for g in routes if g.group == mq.group), route)
            if route is None:
                raise LedgerMQError(f"no route to group {mq.group} for {mq.topic}")
            addresses = ([self.cluster.leader_address(route, attempt)] if leader
                         else self.cluster.read_addresses(route))
            for address in addresses:
                try:
                    return await self.cluster.request(address, code, body, timeout=timeout)
                except NotLeaderError as exc:
                    last = exc
                    if exc.leader:
                        self.cluster.note_leader(mq.group, exc.leader)
                    else:
                        self.cluster.forget_leader(mq.group)
                except (*RETRIABLE, ServiceUnavailableError, OutcomeUnknownError) as exc:
                    last = exc
                    self.cluster.forget_leader(mq.group)
            await asyncio.sleep(min(0.05 * 2**attempt, 0.5))
        assert last is not None
        raise last

    async def pull(self, mq: MessageQueue, offset: int, max_messages: int = 32,
                   tags: list[str] | None = None, wait_ms: int = 0) -> PullResult:
        """Messages of `mq` from `offset`. An offset deleted by retention
        continues from the oldest retained message (the result's `moved_from`
        says so) or raises OffsetMovedError, as `on_offset_moved` says."""
        asked = offset
        for _ in range(8):  # retention may move the start again meanwhile
            try:
                result = await self._pull_once(mq, offset, max_messages, tags, wait_ms)
            except (OffsetMovedError, OffsetOutOfRangeError) as exc:
                moved = _moved(exc, offset)
                if moved is None:
                    raise
                self.offsets_moved += 1
                lo = moved.min_offset
                if self.on_offset_moved == "error" or lo is None or lo <= offset:
                    log.error("%s: offset %d of %s was deleted by retention (oldest"
                              " retained: %s)", self.name, offset, mq, lo)
                    raise moved from None
                log.warning("%s: offset %d of %s was deleted by retention; continuing from"
                            " the oldest retained message, offset %d (%d skipped)",
                            self.name, offset, mq, lo, lo - offset)
                offset = lo
                continue
            if offset != asked:
                return replace(result, moved_from=asked)
            return result
        raise OffsetMovedError(f"the start of {mq} kept moving past the pulls", data={
            "requested": asked, "min_offset": offset})

    async def _pull_once(self, mq: MessageQueue, offset: int, max_messages: int,
                         tags: list[str] | None, wait_ms: int) -> PullResult:
        # "group": the consumer group, whose SUB grant the broker's ACL checks.
        body = {"topic": mq.topic, "queue_id": mq.queue_id, "offset": offset,
                "max_messages": max_messages, "tags": tags, "wait_ms": wait_ms,
                "group": self.group}
        timeout = self.cluster.timeout + wait_ms / 1000
        try:
            reply = await self._on_group(mq, RequestCode.PULL_MESSAGES, body, leader=False,
                                         timeout=timeout)
        except OffsetOutOfRangeError as exc:
            data = exc.data if isinstance(exc.data, dict) else {}
            if offset <= data.get("max_offset", offset):
                raise  # below the range (an older broker's answer): no node can do better
            # Beyond this node's end: a follower that has not caught up yet
            # (after a failover, say). The leader has every committed message,
            # so only its answer may move the consumer's offset.
            reply = await self._on_group(mq, RequestCode.PULL_MESSAGES, body, leader=True,
                                         timeout=timeout)
        return PullResult([ReceivedMessage.from_wire(m, mq.group) for m in reply["messages"]],
                          reply["next_offset"], reply["min_offset"], reply["max_offset"])

    async def queue_range(self, mq: MessageQueue) -> tuple[int, int]:
        reply = await self._on_group(mq, RequestCode.GET_QUEUE_OFFSETS,
                                     {"topic": mq.topic, "queue_id": mq.queue_id,
                                      "group": self.group}, leader=False)
        return reply["min_offset"], reply["max_offset"]

    async def committed(self, mq: MessageQueue) -> int:
        """The group's committed offset of `mq` (-1 if none), read from the leader."""
        reply = await self._on_group(mq, RequestCode.QUERY_OFFSET, {
            "group": self.group, "topic": mq.topic, "queue_id": mq.queue_id}, leader=True)
        offset: int = reply["offset"]
        return offset

    async def commit_group(self, group: str, offsets: dict[MessageQueue, int]) -> None:
        if not offsets:
            return
        mq = next(iter(offsets))
        await self._on_group(mq, RequestCode.COMMIT_OFFSETS, {
            "group": self.group,
            "offsets": [[q.topic, q.queue_id, o] for q, o in offsets.items()]}, leader=True)

    async def commit(self, mq: MessageQueue, offset: int) -> None:
        await self.commit_group(mq.group, {mq: offset})


class PushConsumer:
    def __init__(
        self,
        namesrv: Sequence[str],
        group: str,
        topic: str,
        callback: Callback,
        *,
        tags: str = "*",
        mode: str = "clustering",
        client_id: str | None = None,
        offsets_path: str | None = None,
        consume_from: str = "first",
        batch_size: int = 32,
        long_poll_ms: int = 2000,
        heartbeat_interval: float = 1.0,
        rebalance_interval: float = 1.0,
        commit_interval: float = 0.2,
        max_reconsume_times: int = 16,
        on_give_up: Callable[[ReceivedMessage, BaseException], None] | None = None,
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
        on_offset_moved: str = "earliest",
    ) -> None:
        if mode not in ("clustering", "broadcasting"):
            raise ValueError("mode must be 'clustering' or 'broadcasting'")
        if consume_from not in ("first", "last"):
            raise ValueError("consume_from must be 'first' or 'last'")
        if not valid_topic(topic):
            raise ValueError(f"invalid topic name {topic[:200]!r}: 1-{TOPIC_LENGTH_MAX}"
                             " characters of [A-Za-z0-9_%|-]")
        self.group, self.topic, self.callback, self.mode = group, topic, callback, mode
        self.tags = None if tags.strip() in ("", "*") else [
            t.strip() for t in tags.split("||") if t.strip()]
        self.tag_expression = tags
        self.client_id = client_id or f"{os.getpid()}@{uuid.uuid4().hex[:8]}"
        self.consume_from = consume_from
        self.batch_size = batch_size
        self.long_poll_ms = long_poll_ms
        self.heartbeat_interval = heartbeat_interval
        self.rebalance_interval = rebalance_interval
        self.commit_interval = commit_interval
        self.max_reconsume_times = max_reconsume_times
        self.on_give_up = on_give_up
        self.puller = PullConsumer(namesrv, group, name=f"consumer {self.client_id}",
                                   credentials=credentials, tls=tls,
                                   on_offset_moved=on_offset_moved)
        if mode == "broadcasting":
            path = offsets_path or os.path.join(
                os.path.expanduser("~"), ".ledgermq", f"{group}-{self.client_id}.offsets.json")
            self.store: LocalOffsetStore | RemoteOffsetStore = LocalOffsetStore(path)
        else:
            self.store = RemoteOffsetStore(self.puller.committed, self.puller.commit_group)
        self._workers: dict[MessageQueue, asyncio.Task[None]] = {}
        self._progress: dict[MessageQueue, int] = {}
        self._committed: dict[MessageQueue, int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self.assigned: list[MessageQueue] = []
        self.consumed = 0
        self.given_up = 0
        self.rebalances = 0
        # Queues stopped by OffsetMovedError (on_offset_moved="error"): they
        # stay stopped, and assigned to this member, until it is restarted.
        self.failures: dict[MessageQueue, OffsetMovedError] = {}

    @property
    def offsets_moved(self) -> int:
        """Pulls whose offset had been deleted by retention."""
        return self.puller.offsets_moved

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> PushConsumer:
        await self._heartbeat_once()
        await self._rebalance()
        self._tasks = [asyncio.create_task(self._every(self.heartbeat_interval,
                                                       self._heartbeat_once)),
                       asyncio.create_task(self._every(self.rebalance_interval, self._rebalance)),
                       asyncio.create_task(self._every(self.commit_interval, self._commit))]
        return self

    async def stop(self) -> None:
        """Stop pulling, commit what was consumed, leave the group."""
        self._stopping.set()
        await cancel_and_wait(self._tasks)
        await self._release(list(self._workers))
        with contextlib.suppress(Exception):
            await self._commit()
        if self.mode == "clustering":
            await self._heartbeat_once(leave=True)
        await self.puller.close()

    async def __aenter__(self) -> PushConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _every(self, interval: float, fn: Callable[[], Awaitable[None]]) -> None:
        # Also ends on _stopping: stop() must not rely on a cancellation
        # reaching this loop through every library call `fn` makes.
        while not self._stopping.is_set():
            await asyncio.sleep(interval)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("%s: %s failed: %r", self.client_id, fn.__name__, exc)

    # ------------------------------------------------------------ membership

    async def _heartbeat_once(self, leave: bool = False) -> None:
        """Heartbeat every node of every group serving the topic."""
        routes = await self.puller.cluster.try_route(self.topic)
        body = {"group": self.group, "client_id": self.client_id, "mode": self.mode,
                "subscriptions": {self.topic: self.tag_expression}, "leave": leave}
        calls = [self.puller.cluster.request(address, RequestCode.CLIENT_HEARTBEAT, body,
                                             timeout=1.0)
                 for route in routes for address in route.nodes]
        await asyncio.gather(*calls, return_exceptions=True)

    async def _members(self) -> list[str]:
        routes = await self.puller.cluster.try_route(self.topic)
        for route in routes:
            for address in self.puller.cluster.read_addresses(route):
                with contextlib.suppress(*RETRIABLE, LedgerMQError):
                    reply = await self.puller.cluster.request(
                        address, RequestCode.GET_MEMBERS, {"group": self.group}, timeout=1.0)
                    members: list[str] = reply["members"]
                    return members
        return [self.client_id]

    async def _rebalance(self) -> None:
        if self._stopping.is_set():
            return
        queues = await self.puller.queues(self.topic, refresh=True)
        if self.mode == "broadcasting":
            mine = sorted(queues)
        else:
            members = await self._members()
            if self.client_id not in members:
                members = [*members, self.client_id]
            mine = allocate_averagely(queues, members, self.client_id)
        gone = [mq for mq in self._workers if mq not in mine]
        new = [mq for mq in mine if mq not in self._workers]
        if gone or new:
            self.rebalances += 1
            log.info("%s: rebalance: +%s -%s", self.client_id, [str(q) for q in new],
                     [str(q) for q in gone])
        await self._release(gone)
        for mq in new:
            self._workers[mq] = asyncio.create_task(self._consume_queue(mq))
        self.assigned = sorted(self._workers)

    async def _release(self, queues: list[MessageQueue]) -> None:
        """Stop consuming queues given to another member; commit their progress."""
        tasks = [self._workers.pop(mq) for mq in queues if mq in self._workers]
        await cancel_and_wait(tasks)
        done = {mq: self._progress[mq] for mq in queues if mq in self._progress}
        if done:
            with contextlib.suppress(Exception):
                await self.store.commit(done)
                self._committed.update(done)
        for mq in queues:
            self._progress.pop(mq, None)
            self._committed.pop(mq, None)

    # ------------------------------------------------------------- consuming

    async def _start_offset(self, mq: MessageQueue) -> int:
        committed = await self.store.read(mq)
        if committed >= 0:
            return committed
        lo, hi = await self.puller.queue_range(mq)
        return lo if self.consume_from == "first" else hi

    async def _consume_queue(self, mq: MessageQueue) -> None:
        offset = None
        while not self._stopping.is_set():
            try:
                if offset is None:
                    offset = await self._start_offset(mq)
                    self._committed[mq] = offset
                result = await self.puller.pull(mq, offset, self.batch_size, self.tags,
                                                self.long_poll_ms)
            except OffsetMovedError as exc:
                # on_offset_moved="error" (the pull continues by itself
                # otherwise): stop this queue rather than skip silently.
                self.failures[mq] = exc
                log.error("%s: stopped consuming %s: %s", self.client_id, mq, exc)
                return
            except OffsetOutOfRangeError as exc:
                # Beyond the range (the leader says so): committed messages
                # were lost (e.g. flush=async and a power cut on a majority); go
                # to the end so new messages in those slots are not skipped.
                data = exc.data if isinstance(exc.data, dict) else {}
                hi = data.get("max_offset", 0)
                log.warning("%s: offset %s of %s beyond the queue's end %s; resetting",
                            self.client_id, offset, mq, hi)
                offset = hi
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("%s: pull %s failed: %r", self.client_id, mq, exc)
                await asyncio.sleep(0.1)
                continue
            for message in result.messages:
                await self._deliver(message)
                self._progress[mq] = message.queue_offset + 1
            offset = result.next_offset
            if result.next_offset > self._progress.get(mq, -1):
                self._progress[mq] = result.next_offset

    async def _deliver(self, message: ReceivedMessage) -> None:
        attempt = 0
        while True:
            try:
                outcome = self.callback(message)
                if inspect.isawaitable(outcome):
                    await outcome
                self.consumed += 1
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                attempt += 1
                message.reconsume_times += 1
                if attempt > self.max_reconsume_times:
                    self.given_up += 1
                    log.error("%s: giving up on %s after %d attempts: %r", self.client_id,
                              message.msg_id, attempt, exc)
                    if self.on_give_up is not None:
                        self.on_give_up(message, exc)
                    return
                await asyncio.sleep(min(0.05 * 2 ** (attempt - 1), 2.0))

    async def _commit(self) -> None:
        changed = {mq: o for mq, o in self._progress.items()
                   if mq in self._workers and self._committed.get(mq) != o}
        if changed:
            await self.store.commit(changed)
            self._committed.update(changed)
