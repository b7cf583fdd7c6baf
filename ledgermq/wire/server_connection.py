"""One RPC server connection as an asyncio Protocol: frames parsed where the
bytes arrive, no StreamReader and no task step per request.

A StreamReader read loop costs each request a future woken in
`feed_data`, a task step one loop iteration later and two `readexactly`
calls with their copies. Here `data_received` cuts every whole small frame
out of the buffer and hands it to the server at once (`serve(on_frame)`):
the per-message path (docs/architecture.md, "The per-message path").

The bounds are those of `streams.read_held_frame` (ledgermq/wire/limits.py):

- a small uncompressed frame (at most SMALL_FRAME_BYTES) reserves its
  length from the server's `ByteBudget` as soon as its header is in, and
  is taken whole once it arrived; the reservation is held until the
  request is answered;
- any other frame (large, compressed, or one whose reservation must wait)
  is read by the same coroutine a stream server uses, `read_held_frame`,
  on this connection's buffer (`read`/`readexactly` below), chunk by chunk
  under the budget; fast parsing resumes after it;
- reading pauses while more than `pending_max` bytes wait unparsed, while
  the connection has `max_inflight` requests in flight, and while the
  answers pile up unsent (the transport's high-water mark);
- the server's watchdog sees a frame's progress in `watch` (its first byte
  and how much arrived), as with the stream reader.

A frame that breaks the protocol (malformed, oversized) stops reading and
ends `done` with the error; a clean end of input between frames ends it
with None. The server answers what is in flight, sends its error frame and
closes, as for a stream connection.
"""

from __future__ import annotations

import asyncio
from asyncio.streams import FlowControlMixin
from collections.abc import Callable
from typing import Any, cast

from ledgermq.base.errors import MalformedFrameError
from ledgermq.wire.busy_poll import BusyPoll
from ledgermq.wire.codec import FLAG_ZSTD, HEADER_SIZE, decode_header
from ledgermq.wire.limits import READ_CHUNK_BYTES, SMALL_FRAME_BYTES
from ledgermq.wire.streams import FrameGuard, FrameWatch, HeldFrame, read_held_frame

# Unparsed bytes a connection may hold before reading pauses (the slow
# path's reads and the handshake). A small frame in progress is reserved
# from the budget and may hold up to its own size on top.
DEFAULT_PENDING_MAX = READ_CHUNK_BYTES

FrameSink = Callable[[HeldFrame], None]


class ServerConnection(FlowControlMixin, asyncio.Protocol):
    """The bytes of one accepted connection; `on_connect(self)` runs once
    it is made. Until `serve` it only buffers (the server reads its
    handshake with `read`/`readexactly`)."""

    def __init__(self, on_connect: Callable[[ServerConnection], None],
                 pending_max: int = DEFAULT_PENDING_MAX,
                 poller: BusyPoll | None = None) -> None:
        super().__init__()
        self._on_connect = on_connect
        self._poller = poller  # watches the socket during spins (busy_poll.py)
        self._polled: int | None = None
        self._pending_max = pending_max
        self._buffer = bytearray()
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None
        loop = asyncio.get_running_loop()
        self._clock = loop.time  # the server's watchdog reads `watch` in loop time
        self._closed: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self._over_ssl = False
        # Serving (set by `serve`).
        self._sink: FrameSink | None = None
        self._guard: FrameGuard | None = None
        self._watch: FrameWatch | None = None
        self._max_inflight = 0
        self.inflight = 0
        self.done: asyncio.Future[None] | None = None
        # A small frame whose header was parsed: its length, and the budget
        # bytes reserved for it (taken when the header arrived).
        self._length = -1
        self._reading_paused = False
        self._write_paused = False
        self._slow: asyncio.Task[None] | None = None
        self._pumping = False

    # ------------------------------------------------------------ protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have
        # its methods.
        self.transport = cast(asyncio.Transport, transport)
        self._over_ssl = transport.get_extra_info("sslcontext") is not None
        if self._poller is not None:
            self._polled = self._poller.watch(self, transport)
        self._on_connect(self)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._sink is not None and self._slow is None:
            self._pump()
        else:
            self._wake()
        self._apply_pause()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        if self._sink is not None and self._slow is None:
            self._pump()
        # Half-closed: the answers to what was read still go out (as a
        # StreamReaderProtocol keeps a TCP transport open); TLS cannot.
        return not self._over_ssl

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._poller is not None and self._polled is not None:
            self._poller.unwatch(self, self._polled)
        self._eof = True
        self._wake()
        if self._sink is not None and self._slow is None:
            self._pump()
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_paused = True

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_paused = False
        self._unblock()

    def _get_close_waiter(self, stream: Any) -> asyncio.Future[None]:
        """StreamWriter.wait_closed's future (a StreamWriter writes for us)."""
        return self._closed

    # -------------------------------------------- reads for the handshake path

    async def read(self, n: int = -1) -> bytes:
        """Up to `n` (all if negative) buffered bytes, waiting for some; b"" at EOF."""
        while not self._buffer:
            if self._eof:
                return b""
            await self._wait()
        if n < 0:
            n = len(self._buffer)
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        self._apply_pause()
        return data

    async def readexactly(self, n: int) -> bytes:
        """Exactly `n` bytes; IncompleteReadError when the input ends first."""
        while len(self._buffer) < n:
            if self._eof:
                partial = bytes(self._buffer)
                self._buffer.clear()
                raise asyncio.IncompleteReadError(partial, n)
            await self._wait()
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        self._apply_pause()
        return data

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        self._apply_pause()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ---------------------------------------------------------------- serve

    def serve(self, sink: FrameSink, guard: FrameGuard, watch: FrameWatch,
              max_inflight: int) -> asyncio.Future[None]:
        """From now on hand every frame to `sink` (a HeldFrame holding its
        budget bytes) as it arrives, at most `max_inflight` unanswered at
        once (`request_done` counts them down). Returns `done`: None at a
        clean end of input, the error that stopped reading otherwise."""
        self._sink, self._guard, self._watch = sink, guard, watch
        self._max_inflight = max_inflight
        self.done = asyncio.get_running_loop().create_future()
        self._pump()
        self._apply_pause()
        return self.done

    def set_guard(self, guard: FrameGuard) -> None:
        """The cap for frames from now on (a connection that authenticated
        may send larger ones than before)."""
        self._guard = guard

    def request_done(self) -> None:
        """One request handed to the sink has been answered."""
        self.inflight -= 1
        if self.inflight == self._max_inflight - 1:
            self._unblock()

    def halt(self) -> None:
        """Stop handing over frames for good (the connection is being
        closed); what arrives later is only buffered, up to `pending_max`,
        for a lingering close to read and drop."""
        self._sink = None
        if self._length >= 0:
            self._release_partial()
        if self._slow is not None:
            self._slow.cancel()
        self._buffer.clear()
        self._apply_pause()

    def _blocked(self) -> bool:
        return self.inflight >= self._max_inflight or self._write_paused

    def _unblock(self) -> None:
        if self._sink is not None and self._slow is None and not self._blocked():
            self._pump()
            self._apply_pause()

    def _pump(self) -> None:
        """Hand over every whole frame in the buffer, as far as the bounds allow."""
        if self._pumping:
            return  # a sink's answer re-entered (its write resumed us)
        self._pumping = True
        try:
            self._pump_frames()
        except Exception as exc:
            self._stop(exc)
        finally:
            self._pumping = False

    def _pump_frames(self) -> None:
        buffer = self._buffer
        guard = self._guard
        watch = self._watch
        assert guard is not None and watch is not None
        while self._sink is not None and not self._blocked():
            if self._length < 0:
                if not buffer:
                    watch.reading = False
                    if self._eof:
                        self._stop(None)
                    return
                if not watch.reading:
                    watch.reading, watch.since = True, self._clock()
                    watch.waiting_budget, watch.length, watch.got = False, 0, 0
                if len(buffer) < HEADER_SIZE:
                    if self._eof:
                        raise MalformedFrameError(
                            "connection closed inside a frame header"
                            f" ({len(buffer)} of {HEADER_SIZE} bytes)")
                    return
                length, flags = decode_header(bytes(buffer[:HEADER_SIZE]), guard.max_frame_bytes)
                budget = guard.budget
                if (length > SMALL_FRAME_BYTES or flags & FLAG_ZSTD
                        or (budget is not None and not budget.try_acquire(length, True))):
                    self._read_slowly()
                    return
                self._length = length
                watch.length = length
            length = self._length
            end = HEADER_SIZE + length
            if len(buffer) < end:
                watch.got = len(buffer) - HEADER_SIZE
                if self._eof:
                    raise MalformedFrameError(
                        f"connection closed inside a frame ({len(buffer) - HEADER_SIZE} of"
                        f" {length} payload bytes)")
                return
            payload = bytes(buffer[HEADER_SIZE:end])
            del buffer[:end]
            self._length = -1
            watch.reading, watch.since = False, self._clock()
            self.inflight += 1
            self._sink(HeldFrame(payload, length if guard.budget is not None else 0,
                                 guard.budget))

    def _read_slowly(self) -> None:
        """A frame the fast path does not take (large, compressed, or waiting
        for budget): read by `read_held_frame` in a task, then fast again."""
        self._slow = asyncio.ensure_future(self._slow_frame())
        self._apply_pause()

    async def _slow_frame(self) -> None:
        guard, watch = self._guard, self._watch
        assert guard is not None and watch is not None
        try:
            frame = await read_held_frame(self, guard, b"", watch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._slow = None
            self._stop(exc)
            return
        self._slow = None
        watch.reading, watch.since = False, self._clock()
        if frame is None:
            self._stop(None)
            return
        if self._sink is None:
            frame.release()
            return
        self.inflight += 1
        try:
            self._sink(frame)
        except Exception as exc:
            self._stop(exc)
            return
        self._pump()
        self._apply_pause()

    def _release_partial(self) -> None:
        guard = self._guard
        if guard is not None and guard.budget is not None:
            guard.budget.release(self._length)
        self._length = -1

    def _stop(self, error: BaseException | None) -> None:
        """Reading is over: at a clean end of input (None) or for `error`."""
        self._sink = None
        if self._length >= 0:
            self._release_partial()
        self._buffer.clear()
        done = self.done
        if done is not None and not done.done():
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)
        self._apply_pause()

    def _apply_pause(self) -> None:
        """Pause reading while nothing more should come in (unparsed bytes
        above the bound, requests or answers piling up); else read."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._sink is not None and self._slow is None and self._waiter is None:
            pending = len(self._buffer) - (HEADER_SIZE + self._length if self._length >= 0
                                           else 0)
            want_pause = self._blocked() or pending > self._pending_max
        else:
            want_pause = len(self._buffer) > self._pending_max
        if want_pause and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not want_pause and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
