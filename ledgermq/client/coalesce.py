"""Client-side batching of concurrent sends to one broker (like Kafka's linger=0).

Python pays per request, not per byte, on both ends of a connection. While
`max_inflight` SEND_MESSAGES requests to an address are outstanding, further
sends to it wait and then go out together as one request; each caller still
gets its own per-message results. With no load a send goes out at once, alone,
from its caller's task (`send_one`).

Sends are appended to the address's open `Batch` as they arrive: its records
blob is built in place (the producer encodes each record straight into
`Batch.buf`), and each caller keeps the few numbers that locate its records in
the request (byte position, record index, index and rank of its queue among
the request's queues), so one reply answers every caller in O(1) per
message, with no per-message lists on the way.

If a combined request fails with an error that concerns the whole request
(NOT_LEADER, unavailable, connection lost, outcome unknown) every caller gets
it and retries on its own; an error that may concern one message only
(MESSAGE_TOO_LARGE, INVALID_REQUEST, NO_PERMISSION, UNKNOWN_TOPIC) is
attributed by re-sending each caller's records separately.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ledgermq.base.errors import (
    InvalidRequestError,
    MessageTooLargeError,
    NoPermissionError,
    UnknownTopicError,
)
from ledgermq.client.records import Result, decode_reply

# send(address, records blob, record count) -> the SEND_MESSAGES reply body
Send = Callable[[str, Any, int], Awaitable[Any]]
_PER_MESSAGE = (MessageTooLargeError, InvalidRequestError, NoPermissionError, UnknownTopicError)

# What a caller's future resolves to: (base, queue_offsets, results, alone),
# the reply's fields (`results` is None unless the reply lists per-message
# results). `alone` is False when the reply answers the whole combined request
# (the caller locates its records with the numbers `Batch.add` gave it) and
# True when it answers the caller's records sent by themselves (first record
# at byte 0, index 0, queue index 0).
Outcome = tuple[int | None, list[int] | None, list[dict[str, Any]] | None, bool]
# An Outcome and where the caller's record is in the request: (outcome, start
# byte, record index, queue index, rank in its queue), all 0 when `alone`.
Placed = tuple[Outcome, int, int, int, int]


class Batch:
    """The records of one request being built for one address."""

    __slots__ = ("buf", "count", "keys", "waiters")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.count = 0
        # (topic, queue id) -> [its index in the reply's queue_offsets, records so far]
        self.keys: dict[tuple[str, int], list[int]] = {}
        # (future, start byte, end byte, records) per caller
        self.waiters: list[tuple[asyncio.Future[Outcome], int, int, int]] = []

    def add(self, future: asyncio.Future[Outcome], key: tuple[str, int], start: int,
            n: int) -> tuple[int, int, int]:
        """Register the `n` records of one caller, all of queue `key`, appended
        at `buf[start:]`; returns (first record index, queue index, rank of the
        first record within its queue in this request)."""
        slot = self.keys.get(key)
        if slot is None:
            index, rank = len(self.keys), 0
            self.keys[key] = [index, n]
        else:
            index, rank = slot
            slot[1] = rank + n
        first = self.count
        self.count = first + n
        self.waiters.append((future, start, len(self.buf), n))
        return first, index, rank


class _Address:
    __slots__ = ("group", "inflight", "queue", "scheduled")

    def __init__(self, group: str) -> None:
        self.group = group
        self.queue: deque[Batch] = deque()
        self.inflight = 0
        self.scheduled = False


# `max_inflight` meaning "no limit" (the Producer's `coalesce=False`).
UNLIMITED_INFLIGHT = 1 << 30


class SendCoalescer:
    def __init__(self, send: Send, *, max_inflight: int = 2, max_messages: int = 1024,
                 max_bytes: int = 2 << 20) -> None:
        self._send = send
        self.max_inflight = max_inflight
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._addresses: dict[str, _Address] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.requests = 0

    @property
    def merges(self) -> bool:
        """Whether a send may wait for, or share, a request: False when each
        goes out at once and alone (one record per request, no limit on
        requests in flight), so `send_alone` serves it in its caller's task."""
        return self.max_messages > 1 or self.max_inflight < UNLIMITED_INFLIGHT

    async def send_alone(self, address: str, record: bytes) -> Placed:
        """One encoded record as a request of its own, awaited in the
        caller's task: no batch, no future, no task of the coalescer's (the
        per-message path when `merges` is False). Raises what the request
        raises, or ValueError for a reply that does not fit it."""
        self.requests += 1
        reply = await self._send(address, record, 1)
        _check(reply, 1, 1)
        outcome = (reply.get("base"), reply.get("queue_offsets"), reply.get("results"), True)
        return outcome, 0, 0, 0, 0

    async def send_one(self, address: str, group: str, key: tuple[str, int], head: bytes,
                       body: bytes) -> Placed:
        """One record (its `head` and `body` bytes) of queue `key`, merged
        with the sends to `address` that come with it: the producer's hot
        path when `merges` is True. Returns the reply's outcome and where the
        record is in the request (`add_one`). Raises what the request raises
        when the record went out alone.

        A send that finds the address idle (nothing queued, in flight or
        about to go) opens the request and waits one loop pass, as `open`'s
        scheduled `_kick` would, for the sends woken in the same pass to join.
        If none did, the record goes out alone, awaited in this caller's task
        like `send_alone`: one send at a time (W=1) pays neither the
        coalescer's task nor a future, which cost the merged path 5-7 % of
        W=1's throughput against merging off (docs/broker.md). If some did,
        the request goes out as it would have, in a task of its own, so that
        cancelling one caller cancels nobody else's send."""
        state = self._addresses.get(address)
        if state is None or state.group != group:
            state = self._addresses[address] = _Address(group)
        if state.queue or state.inflight or state.scheduled:
            future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
            start, first, index, rank = self.add_one(address, group, key, future, head, body)
            outcome = await future
            if outcome[3]:  # re-sent alone (`_alone`): its record is the request's first
                return outcome, 0, 0, 0, 0
            return outcome, start, first, index, rank
        batch = Batch()
        state.queue.append(batch)
        state.scheduled = True  # nobody else schedules a `_kick` meanwhile
        record = head + body
        batch.buf += record
        batch.count = 1
        batch.keys[key] = [0, 1]
        # Awaited only if the request goes to a task (others joined).
        future = asyncio.get_running_loop().create_future()
        batch.waiters.append((future, 0, len(record), 1))
        try:
            await asyncio.sleep(0)
        except BaseException:
            future.cancel()
            self._kick(address, state)  # the others' records still go
            raise
        if batch.count > 1 or len(state.queue) > 1:
            self._kick(address, state)
            return await future, 0, 0, 0, 0
        state.queue.popleft()
        state.scheduled = False
        state.inflight += 1
        try:
            return await self.send_alone(address, record)
        finally:
            state.inflight -= 1
            if state.queue and not state.scheduled:
                state.scheduled = True
                asyncio.get_running_loop().call_soon(self._kick, address, state)

    def open(self, address: str, group: str, nbytes: int, n: int) -> Batch:
        """The batch for `address` (of `group`) that `n` more records of about
        `nbytes` join: the caller appends them to `buf` and registers them with
        `Batch.add` before it yields to the loop (the request goes out at the
        end of this loop iteration at the earliest)."""
        state = self._addresses.get(address)
        if state is None or state.group != group:
            state = self._addresses[address] = _Address(group)
        queue = state.queue
        if queue:
            batch = queue[-1]
            if (batch.count + n > self.max_messages
                    or len(batch.buf) + nbytes > self.max_bytes) and batch.count:
                batch = Batch()
                queue.append(batch)
        else:
            batch = Batch()
            queue.append(batch)
        if not state.scheduled and state.inflight < self.max_inflight:
            state.scheduled = True
            asyncio.get_running_loop().call_soon(self._kick, address, state)
        return batch

    def add_one(self, address: str, group: str, key: tuple[str, int],
                future: asyncio.Future[Outcome], head: bytes, body: bytes
                ) -> tuple[int, int, int, int]:
        """`open`, append one record (its `head` and `body` bytes) and
        `Batch.add` it, in one call (the producer's hot path). Returns (start
        byte, record index, queue index, rank in its queue)."""
        state = self._addresses.get(address)
        if state is None or state.group != group:
            state = self._addresses[address] = _Address(group)
        queue = state.queue
        size = len(head) + len(body)
        if queue:
            batch = queue[-1]
            buf = batch.buf
            if batch.count and (batch.count >= self.max_messages
                                or len(buf) + size > self.max_bytes):
                batch = Batch()
                queue.append(batch)
                buf = batch.buf
        else:
            batch = Batch()
            queue.append(batch)
            buf = batch.buf
        if not state.scheduled and state.inflight < self.max_inflight:
            state.scheduled = True
            asyncio.get_running_loop().call_soon(self._kick, address, state)
        start = len(buf)
        buf += head
        buf += body
        first = batch.count
        batch.count = first + 1
        batch.waiters.append((future, start, start + size, 1))
        slot = batch.keys.get(key)
        if slot is None:
            batch.keys[key] = [len(batch.keys), 1]
            return start, first, len(batch.keys) - 1, 0
        index, rank = slot
        slot[1] = rank + 1
        return start, first, index, rank

    async def submit(self, address: str, group: str, records: Sequence[bytes],
                     keys: Sequence[tuple[str, int]]) -> list[Result]:
        """Send already encoded `records` (client.records) to the broker at
        `address` of `group`; one result per record. `keys[k]` is record k's
        (topic, queue id); consecutive records of one queue are registered as
        one caller."""
        if not records:
            return []
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        batch = self.open(address, group, sum(map(len, records)), len(records))
        start = len(batch.buf)
        firsts = []
        i = 0
        while i < len(records):
            j = i + 1
            while j < len(records) and keys[j] == keys[i]:
                j += 1
            at = len(batch.buf)
            for record in records[i:j]:
                batch.buf += record
            if i == 0:
                firsts.append(batch.add(future, keys[i], at, j - i))
            else:
                # Later runs ride on the first run's future (same caller).
                slot = batch.keys.get(keys[i])
                if slot is None:
                    index, rank = len(batch.keys), 0
                    batch.keys[keys[i]] = [index, j - i]
                else:
                    index, rank = slot
                    slot[1] = rank + j - i
                future0, start0, _, n0 = batch.waiters[-1]
                batch.waiters[-1] = (future0, start0, len(batch.buf), n0 + j - i)
                firsts.append((batch.count, index, rank))
                batch.count += j - i
            i = j
        base, offsets, results, alone = await future
        if alone:
            return decode_reply({"base": base, "queue_offsets": offsets, "results": results},
                                group, records, keys)
        out: list[Result] = []
        at = start
        k = 0
        for (first, index, rank), run_end in zip(firsts, _run_ends(keys), strict=True):
            for n in range(run_end - k):
                if results is not None:
                    r = results[first + n]
                    out.append((r["msg_id"], r["queue_id"], r["queue_offset"],
                                bool(r.get("duplicate"))))
                else:
                    # `_check` refused a reply with neither per-message results nor a base.
                    assert base is not None
                    out.append((f"{group}@{base + at:016X}", keys[k + n][1],
                                None if offsets is None else offsets[index] + rank + n, False))
                at += len(records[k + n])
            k = run_end
        return out

    def _kick(self, address: str, state: _Address) -> None:
        state.scheduled = False
        queue = state.queue
        while queue and state.inflight < self.max_inflight:
            batch = queue.popleft()
            if not batch.count:
                continue  # every caller failed to encode its records
            state.inflight += 1
            task = asyncio.create_task(self._run(address, state, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, address: str, state: _Address, batch: Batch) -> None:
        try:
            self.requests += 1
            try:
                reply = await self._send(address, batch.buf, batch.count)
                _check(reply, batch.count, len(batch.keys))
            except _PER_MESSAGE as exc:
                if len(batch.waiters) == 1:
                    _fail(batch.waiters[0][0], exc)
                    return
                await asyncio.gather(*(self._alone(address, batch, w) for w in batch.waiters))
                return
            except BaseException as exc:
                for waiting in batch.waiters:
                    _fail(waiting[0], exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            outcome = (reply.get("base"), reply.get("queue_offsets"), reply.get("results"), False)
            for waiting in batch.waiters:
                future = waiting[0]
                if not future.done():
                    future.set_result(outcome)
        finally:
            state.inflight -= 1
            if state.queue and not state.scheduled and state.inflight < self.max_inflight:
                state.scheduled = True
                asyncio.get_running_loop().call_soon(self._kick, address, state)

    async def _alone(self, address: str, batch: Batch,
                     waiting: tuple[asyncio.Future[Outcome], int, int, int]) -> None:
        future, start, end, n = waiting
        try:
            reply = await self._send(address, bytes(batch.buf[start:end]), n)
            # The caller's records are of one queue unless it came through
            # `submit` with several runs, whose locations it checks itself.
            _check(reply, n, None)
        except Exception as exc:
            _fail(future, exc)
        else:
            if not future.done():
                future.set_result((reply.get("base"), reply.get("queue_offsets"),
                                   reply.get("results"), True))


def _run_ends(keys: Sequence[tuple[str, int]]) -> list[int]:
    ends = []
    for k in range(1, len(keys)):
        if keys[k] != keys[k - 1]:
            ends.append(k)
    ends.append(len(keys))
    return ends


def _check(reply: Any, count: int, queues: int | None) -> None:
    """Refuse a reply that does not fit the request (before any caller uses it)."""
    results = reply.get("results")
    if results is not None:
        if len(results) != count:
            raise ValueError(f"{len(results)} results for {count} records")
        return
    if not isinstance(reply.get("base"), int):
        raise ValueError(f"reply without base: {reply!r}")
    firsts = reply.get("queue_offsets")
    if firsts is not None and queues is not None and len(firsts) != queues:
        raise ValueError(f"{len(firsts)} queue offsets for {queues} queues")


def _fail(future: asyncio.Future[Outcome], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
