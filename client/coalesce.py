"""Client-side batching of concurrent sends to one broker (like Kafka's linger=0).

Python pays per request, not per byte, on both ends of a connection. While
`max_inflight` SEND_MESSAGES requests to an address are outstanding, further
sends to it wait and then go out together as one request; each caller still
gets its own per-message results. With no load a send goes out at once, alone.

If a combined request fails with an error that concerns the whole request
(NOT_LEADER, unavailable, connection lost, outcome unknown) every caller gets
it and retries on its own; an error that may concern one message only
(MESSAGE_TOO_LARGE, INVALID_REQUEST, NO_PERMISSION, UNKNOWN_TOPIC) is
attributed by re-sending each caller's messages separately.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from client.records import Result, decode_reply
from ledgermq.errors import (
    InvalidRequestError,
    MessageTooLargeError,
    NoPermissionError,
    UnknownTopicError,
)

# send(address, records blob, record count) -> the SEND_MESSAGES reply body
Send = Callable[[str, bytes, int], Awaitable[Any]]
_PER_MESSAGE = (MessageTooLargeError, InvalidRequestError, NoPermissionError, UnknownTopicError)


@dataclass(eq=False)
class _Waiting:
    records: list[bytes]
    keys: list[tuple[str, int]]  # (topic, queue id) per record
    size: int
    future: asyncio.Future[list[Result]] = field(repr=False)


@dataclass
class _Address:
    group: str
    queue: deque[_Waiting] = field(default_factory=deque)
    inflight: int = 0
    scheduled: bool = False


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

    async def submit(self, address: str, group: str, records: list[bytes],
                     keys: list[tuple[str, int]]) -> list[Result]:
        """Send `records` (CommitLog records, see client.records) to the broker
        at `address` of `group`; one result per record."""
        size = sum(map(len, records))
        future = asyncio.get_running_loop().create_future()
        state = self._addresses.get(address)
        if state is None or state.group != group:
            state = self._addresses[address] = _Address(group)
        state.queue.append(_Waiting(records, keys, size, future))
        self._schedule(address, state)
        return await future

    def _schedule(self, address: str, state: _Address) -> None:
        """Start a request at the end of this loop iteration, not at once:
        callers woken by the same reply (one per message it answered) queue
        their next sends first and share it, instead of the first going out
        alone. Costs one loop iteration of latency, nothing more."""
        if not state.scheduled and state.inflight < self.max_inflight:
            state.scheduled = True
            asyncio.get_running_loop().call_soon(self._kick, address, state)

    def _kick(self, address: str, state: _Address) -> None:
        state.scheduled = False
        while state.queue and state.inflight < self.max_inflight:
            batch = [state.queue.popleft()]
            count, size = len(batch[0].records), batch[0].size
            while state.queue:
                nxt = state.queue[0]
                if (count + len(nxt.records) > self.max_messages
                        or size + nxt.size > self.max_bytes):
                    break
                batch.append(state.queue.popleft())
                count += len(nxt.records)
                size += nxt.size
            state.inflight += 1
            task = asyncio.create_task(self._run(address, state, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, address: str, state: _Address, batch: list[_Waiting]) -> None:
        try:
            if len(batch) == 1:
                records, keys = batch[0].records, batch[0].keys
            else:
                records = [r for w in batch for r in w.records]
                keys = [k for w in batch for k in w.keys]
            self.requests += 1
            try:
                reply = await self._send(address, b"".join(records), len(records))
                results = decode_reply(reply, state.group, records, keys)
            except _PER_MESSAGE as exc:
                if len(batch) == 1:
                    _fail(batch[0], exc)
                    return
                await asyncio.gather(*(self._alone(address, state.group, w) for w in batch))
                return
            except BaseException as exc:
                for waiting in batch:
                    _fail(waiting, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            at = 0
            for waiting in batch:
                n = len(waiting.records)
                if not waiting.future.done():
                    waiting.future.set_result(results[at : at + n])
                at += n
        finally:
            state.inflight -= 1
            self._schedule(address, state)

    async def _alone(self, address: str, group: str, waiting: _Waiting) -> None:
        try:
            reply = await self._send(address, b"".join(waiting.records), len(waiting.records))
            results = decode_reply(reply, group, waiting.records, waiting.keys)
        except Exception as exc:
            _fail(waiting, exc)
        else:
            if not waiting.future.done():
                waiting.future.set_result(results)


def _fail(waiting: _Waiting, exc: BaseException) -> None:
    if not waiting.future.done():
        waiting.future.set_exception(exc)
