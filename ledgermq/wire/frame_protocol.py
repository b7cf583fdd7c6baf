"""Frames read by an asyncio Protocol where the bytes arrive: no StreamReader.

A StreamReader costs, per frame, a future woken in `feed_data`, a task step
one loop iteration later and two `readexactly` calls with their buffer
copies. For a connection whose frames are handled synchronously (a Raft
peer's message batches go straight into the node), parsing them in
`data_received` and handing each to a callback there skips all of it
(docs/architecture.md, "The per-message path").

`FrameProtocol` has two modes. At first a coroutine takes frames one at a
time with `next_frame(cap)`: a handshake, under its own small cap. Once the
owner calls `serve(on_frame, cap)`, every whole frame is passed to
`on_frame` from `data_received`, in order. Nothing is parsed ahead of the
mode that reads it: what the peer sent after its last handshake frame waits,
unparsed, for `serve`, so a handshake's cap never judges the data frames
and the data cap never admits a large handshake frame.

Bounded: in the first mode reading pauses while more than `pending_max`
bytes wait (a header announcing more than the cap fails at once, so a whole
capped frame always fits); in the second the buffer holds at most one
partial frame of at most `cap` bytes. Any error (a malformed or oversized
frame, or `on_frame` raising) closes the connection; `wait_closed` returns
it.
"""

from __future__ import annotations

import asyncio
from asyncio.streams import FlowControlMixin
from collections.abc import Callable
from typing import Any, cast

from ledgermq.base.errors import MalformedFrameError
from ledgermq.wire.busy_poll import BusyPoll
from ledgermq.wire.codec import HEADER_SIZE, decode_frame

# Bytes that may wait unread during the first mode before reading pauses.
DEFAULT_PENDING_MAX = 64 * 1024

FrameHandler = Callable[[bytes], None]


class FrameProtocol(FlowControlMixin, asyncio.Protocol):
    """One connection's frames; `on_connect(self)` runs once it is made.

    An `asyncio.StreamWriter` over it writes with backpressure (`drain`)
    and waits for the close (`wait_closed`), as over a stream protocol."""

    def __init__(self, on_connect: Callable[[FrameProtocol], None],
                 pending_max: int = DEFAULT_PENDING_MAX,
                 poller: BusyPoll | None = None) -> None:
        super().__init__()
        self._on_connect = on_connect
        self._poller = poller  # watches the socket during spins (busy_poll.py)
        self._polled: int | None = None
        self._pending_max = pending_max
        self._buffer = bytearray()
        self._on_frame: FrameHandler | None = None
        self._cap = 0
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._paused = False
        self._closed: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future())
        self.transport: asyncio.Transport | None = None

    # ------------------------------------------------------------ protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have
        # its methods.
        self.transport = cast(asyncio.Transport, transport)
        if self._poller is not None:
            self._polled = self._poller.watch(self, transport)
        self._on_connect(self)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._on_frame is not None:
            self._deliver()
            return
        if len(self._buffer) > self._pending_max and not self._paused and self.transport:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._poller is not None and self._polled is not None:
            self._poller.unwatch(self, self._polled)
        self._eof = True
        self._wake()
        if not self._closed.done():
            self._closed.set_result(None)

    def _get_close_waiter(self, stream: Any) -> asyncio.Future[BaseException | None]:
        """StreamWriter.wait_closed's future."""
        return self._closed

    # --------------------------------------------------------------- owner

    @property
    def closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def peername(self) -> object:
        return self.transport.get_extra_info("peername") if self.transport else None

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        """Close after what is buffered for the peer is written; no frame
        is delivered after this."""
        self._on_frame = None
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping what is buffered for the peer."""
        self._on_frame = None
        if self.transport is not None:
            self.transport.abort()

    async def wait_closed(self) -> BaseException | None:
        """Wait for the connection to end; the error that ended it, if one did."""
        return await self._closed

    def on_close(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call `callback(error)` once the connection ended (error: what ended
        it, None for a plain close or end of input)."""
        self._closed.add_done_callback(lambda closed: callback(closed.result()))

    async def next_frame(self, cap: int) -> bytes | None:
        """The next frame's payload (first mode), None on a clean EOF between
        frames. Raises FrameTooLargeError or MalformedFrameError."""
        while True:
            got = decode_frame(self._buffer, cap)
            if got is not None:
                payload, used = got
                del self._buffer[:used]
                if self._paused and len(self._buffer) <= self._pending_max:
                    self._paused = False
                    if self.transport is not None:
                        self.transport.resume_reading()
                return payload
            if self._eof:
                if self._buffer:
                    raise MalformedFrameError(
                        f"connection closed inside a frame ({len(self._buffer)} bytes of it)")
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def serve(self, on_frame: FrameHandler, cap: int) -> None:
        """Second mode: every whole frame, from now on and already buffered,
        goes to `on_frame` as soon as it arrives."""
        self._on_frame = on_frame
        self._cap = cap
        if self._paused:
            self._paused = False
            if self.transport is not None:
                self.transport.resume_reading()
        self._deliver()

    # ------------------------------------------------------------ internal

    def _deliver(self) -> None:
        buffer = self._buffer
        used = 0
        try:
            while self._on_frame is not None and len(buffer) - used >= HEADER_SIZE:
                # Released before the buffer is cut (a live view pins its size).
                view = memoryview(buffer)[used:]
                try:
                    got = decode_frame(view, self._cap)
                finally:
                    view.release()
                if got is None:
                    break
                payload, size = got
                used += size
                self._on_frame(payload)
        except Exception as exc:
            self._fail(exc)
        finally:
            del buffer[:used]

    def _fail(self, exc: BaseException) -> None:
        self._on_frame = None
        self._buffer.clear()
        if not self._closed.done():
            self._closed.set_result(exc)
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
