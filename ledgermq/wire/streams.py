"""Frames over asyncio streams: `read_frame` on a StreamReader, batched writes.

`read_frame` checks the header before reading the payload, so an oversized
length is refused without buffering it. A server reads with `read_held_frame`
instead: the body comes in chunks, each reserved from the server's
`ByteBudget` before it is read, a compressed body reserves its declared
decompressed size before it is decompressed, and the whole frame must arrive
within a deadline once its first byte has (ledgermq/wire/limits.py). Inside
`guarded_reads(...)` a plain `read_frame` is bounded the same way, so the
handshake's frames are too. Writes are batched because Python pays
per call, not per byte: `write_frames` sends many frames with one write, and
`FrameWriter` coalesces frames queued by concurrent tasks during one event-loop
iteration into a single transport write.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from ledgermq.base.errors import (
    MalformedFrameError,
    RequestTimeoutError,
    ServiceUnavailableError,
)
from ledgermq.wire.codec import (
    DEFAULT_COMPRESS_THRESHOLD,
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ZSTD,
    HEADER_SIZE,
    declared_size,
    decode_header,
    decode_payload,
    decompress_exact,
    encode_frame,
    encode_frames,
)
from ledgermq.wire.limits import READ_CHUNK_BYTES, SMALL_FRAME_BYTES, ByteBudget


class ByteSource(Protocol):
    """What frames are read from: an asyncio.StreamReader, or an RPC server
    connection's own buffer (ledgermq/wire/server_connection.py)."""

    async def read(self, n: int = -1) -> bytes: ...

    async def readexactly(self, n: int) -> bytes: ...


# How long a connection closed for a protocol error may keep draining the
# peer's input so that its error frame arrives (see FrameWriter.close).
LINGER_SECONDS = 1.0


@dataclass(frozen=True)
class FrameGuard:
    """How a server connection reads frames: the size cap, the shared budget
    and the deadline for a frame once its first byte arrived (None: none)."""

    max_frame_bytes: int
    budget: ByteBudget | None = None
    read_timeout: float | None = None


class HeldFrame:
    """A frame's payload and the budget bytes it holds until `release()`
    (when the request it carries has been answered)."""

    __slots__ = ("_budget", "held", "payload")

    def __init__(self, payload: bytes | bytearray, held: int, budget: ByteBudget | None) -> None:
        self.payload = payload
        self.held = held
        self._budget = budget

    def release(self) -> None:
        """Give the bytes back (idempotent) and drop the payload."""
        held, self.held = self.held, 0
        self.payload = b""
        if self._budget is not None and held:
            self._budget.release(held)


_GUARD: ContextVar[FrameGuard | None] = ContextVar("ledgermq_frame_guard", default=None)


@contextlib.contextmanager
def guarded_reads(guard: FrameGuard) -> Iterator[None]:
    """Within this block (in this task), `read_frame` reads under `guard`:
    RpcServer uses it around the handshake, whose reads it does not make itself."""
    token = _GUARD.set(guard)
    try:
        yield
    finally:
        _GUARD.reset(token)


class FrameWatch:
    """Where a connection's read loop stands, for a watchdog that enforces
    its deadlines with one timer per connection instead of one per frame
    (RpcServer): `reading` a frame since `since` (else waiting for the next
    one since then), `waiting_budget` while that frame waits for room, and
    how much of it arrived (`got` of `length`) for the error message."""

    __slots__ = ("got", "length", "reading", "since", "waiting_budget")

    def __init__(self) -> None:
        self.reading = False
        self.since = 0.0
        self.waiting_budget = False
        self.length = 0
        self.got = 0


async def read_held_frame(
    reader: ByteSource, guard: FrameGuard, first: bytes = b"",
    watch: FrameWatch | None = None,
) -> HeldFrame | None:
    """Read one frame under `guard`; None on a clean EOF between frames.

    `first` is the frame's first byte if the caller already read it (to wait
    for it under another deadline: the idle timeout). Raises
    FrameTooLargeError (header or declared decompressed size over the cap),
    MalformedFrameError (truncated, corrupt), RequestTimeoutError (the frame
    did not arrive within `guard.read_timeout` of its first byte) or
    ServiceUnavailableError (that deadline passed waiting for budget).

    With `watch`, the deadline is the caller's watchdog's (it cancels the
    read): no timer is started here, and the frame's progress is kept in
    `watch` for the watchdog's error message.
    """
    if not first:
        first = await reader.read(1)
        if not first:
            return None
    if watch is not None:
        return await _read_frame_body(reader, guard, first, watch)
    state = FrameWatch()
    try:
        async with asyncio.timeout(guard.read_timeout):
            return await _read_frame_body(reader, guard, first, state)
    except TimeoutError:
        raise frame_deadline_error(state, guard.read_timeout) from None


def frame_deadline_error(state: FrameWatch, read_timeout: float | None
                         ) -> RequestTimeoutError | ServiceUnavailableError:
    """What a frame that missed its deadline is answered with."""
    if state.waiting_budget:
        return ServiceUnavailableError(
            f"server frame memory is exhausted: a frame of {state.length} bytes waited"
            f" {read_timeout:g}s for room; retry later")
    return RequestTimeoutError(
        f"frame not received within {read_timeout:g}s of its first byte"
        f" ({state.got} of {state.length} payload bytes)")


async def _read_frame_body(reader: ByteSource, guard: FrameGuard, first: bytes,
                           state: FrameWatch) -> HeldFrame:
    """The rest of a frame whose first byte is `first`; budget bytes taken
    here are given back if it fails (or is cancelled by a deadline)."""
    budget = guard.budget
    held = 0
    got = 0
    state.waiting_budget = False
    state.length = state.got = 0
    # A bytearray grown chunk by chunk: no second copy of the body, and it is
    # emptied as soon as the frame fails (an exception's traceback would
    # otherwise keep it alive after its budget was given back).
    body = bytearray()
    try:
        try:
            header = first + await reader.readexactly(HEADER_SIZE - len(first))
        except asyncio.IncompleteReadError as exc:
            raise MalformedFrameError(
                "connection closed inside a frame header"
                f" ({len(first) + len(exc.partial)} of {HEADER_SIZE} bytes)"
            ) from None
        length, flags = decode_header(header, guard.max_frame_bytes)
        state.length = length
        small = length <= SMALL_FRAME_BYTES
        if small and not flags & FLAG_ZSTD and (budget is None
                                                 or budget.try_acquire(length, True)):
            # The common request: room at once for all of it (the slow path
            # below would reserve it whole too), so one read.
            held = length if budget is not None else 0
            try:
                return HeldFrame(await reader.readexactly(length), held, budget)
            except asyncio.IncompleteReadError as exc:
                raise MalformedFrameError(
                    f"connection closed inside a frame ({len(exc.partial)} of {length}"
                    " payload bytes)") from None
        while got < length:
            if held == got and budget is not None:
                step = min(length - got, READ_CHUNK_BYTES)
                state.waiting_budget = True
                await budget.acquire(step, small)
                state.waiting_budget = False
                held += step
            want = (held if budget is not None else length) - got
            chunk = await reader.read(min(want, READ_CHUNK_BYTES))
            if not chunk:
                raise MalformedFrameError(
                    f"connection closed inside a frame ({got} of {length} payload bytes)")
            body += chunk
            got += len(chunk)
            state.got = got
        if not flags & FLAG_ZSTD:
            return HeldFrame(body, held, budget)
        size = declared_size(body, guard.max_frame_bytes)
        if budget is not None:
            state.waiting_budget = True
            await budget.acquire(size, size <= SMALL_FRAME_BYTES)
            state.waiting_budget = False
            held += size
        payload = decompress_exact(body, size)
        body.clear()
        if budget is not None:
            # The compressed bytes are gone; the frame now holds its payload.
            budget.release(held - size)
            held = size
        return HeldFrame(payload, held, budget)
    except BaseException:
        body.clear()
        if budget is not None and held:
            budget.release(held)
        raise


async def read_frame(
    reader: ByteSource, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> bytes | None:
    """Read one frame's (decompressed) payload; None on a clean EOF between frames.

    Raises MalformedFrameError if the stream ends inside a frame, and
    FrameTooLargeError as soon as a header announces too many bytes. Inside
    `guarded_reads`, the guard's budget and deadline apply and its cap
    lowers `max_frame_bytes`.
    """
    guard = _GUARD.get()
    if guard is not None:
        bounded = FrameGuard(min(max_frame_bytes, guard.max_frame_bytes), guard.budget,
                             guard.read_timeout)
        frame = await read_held_frame(reader, bounded)
        if frame is None:
            return None
        payload = bytes(frame.payload)
        # The caller decodes it at once; the budget covers frames in flight.
        frame.release()
        return payload
    try:
        header = await reader.readexactly(HEADER_SIZE)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise MalformedFrameError(
            f"connection closed inside a frame header ({len(exc.partial)} of {HEADER_SIZE} bytes)"
        ) from None
    length, flags = decode_header(header, max_frame_bytes)
    try:
        raw = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise MalformedFrameError(
            f"connection closed inside a frame ({len(exc.partial)} of {length} payload bytes)"
        ) from None
    return decode_payload(flags, raw, max_frame_bytes)


async def write_frames(
    writer: asyncio.StreamWriter,
    payloads: Iterable[bytes],
    *,
    compress_threshold: int | None = DEFAULT_COMPRESS_THRESHOLD,
) -> None:
    """Frame `payloads` and send them with one write, then wait for the buffer to drain."""
    writer.write(encode_frames(payloads, compress_threshold=compress_threshold))
    await writer.drain()


# Frames one `write` carries at most: a burst queued in one pass (a server
# answering a whole window that committed together, a client sending the
# window its answers woke) goes out in slices of this many, so the peer can
# start on the first slice while this side still encodes the rest. At W64
# without merging, 6 alternating pairs gave +4% to +41% msg/s against one
# write per pass (docs/broker.md, "Answers in slices").
WRITE_SLICE_FRAMES = 32


class FrameWriter:
    """Batching frame writer shared by the tasks of one connection.

    `send` only queues; the first `send` of a loop iteration schedules a flush
    with `call_soon`, so every frame queued before the loop next runs
    callbacks goes out in one `write` (in slices of WRITE_SLICE_FRAMES).
    `drain` applies the transport's backpressure to the caller.

    `unflushed`, shared by the writers of one server, holds those with a
    flush scheduled: `flush_all` writes them before the loop runs their
    callbacks (the broker's answers, before the rest of an apply).
    `on_write` is called after each write (a server's busy poll expecting
    the client's next request, ledgermq/wire/busy_poll.py).
    """

    def __init__(
        self,
        writer: asyncio.StreamWriter,
        *,
        compress_threshold: int | None = DEFAULT_COMPRESS_THRESHOLD,
        unflushed: dict[FrameWriter, None] | None = None,
        on_write: Callable[[], None] | None = None,
    ) -> None:
        self._writer = writer
        self._compress_threshold = compress_threshold
        self._pending: list[bytes] = []
        self._scheduled = False
        self._unflushed = unflushed
        self._on_write = on_write
        self.writes = 0  # transport writes issued; lets tests observe batching
        self.frames = 0
        # Set when the connection is closed for a protocol error: `close`
        # then half-closes and discards what the peer still sends for a
        # moment, so the error frame reaches it instead of being lost to the
        # reset a close with unread input causes.
        self.linger_reader: ByteSource | None = None
        self._high_water = writer.transport.get_write_buffer_limits()[1]

    @property
    def closing(self) -> bool:
        return self._writer.is_closing()

    @property
    def backlogged(self) -> bool:
        """More is waiting to be sent than the transport's high-water mark:
        the peer does not read (`drain` waits until it does)."""
        return self._writer.transport.get_write_buffer_size() > self._high_water

    def send(self, payload: bytes) -> None:
        """Queue one payload; silently dropped if the connection is already closing
        (the peer is gone, so nobody could read it)."""
        if self._writer.is_closing():
            return
        pending = self._pending
        pending.append(encode_frame(payload, compress_threshold=self._compress_threshold))
        if len(pending) >= WRITE_SLICE_FRAMES:
            self._write_pending()  # a slice now; the pass's flush takes what follows
        elif not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)
            if self._unflushed is not None:
                self._unflushed[self] = None

    def flush(self) -> None:
        """Write everything queued now, in one write."""
        self._scheduled = False
        if self._unflushed is not None:
            self._unflushed.pop(self, None)
        self._write_pending()

    def _write_pending(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
        self.frames += len(self._pending)
        self._pending.clear()
        if self._writer.is_closing():
            return
        self._writer.write(data)
        self.writes += 1
        if self._on_write is not None:
            self._on_write()

    async def drain(self) -> None:
        await self._writer.drain()

    async def _linger(self, reader: ByteSource) -> None:
        """Send FIN after the error frame, then read and drop the peer's
        bytes until it closes too or LINGER_SECONDS pass (nothing is kept)."""
        with contextlib.suppress(ConnectionError, OSError, TimeoutError, RuntimeError):
            if self._writer.can_write_eof():
                self._writer.write_eof()
            async with asyncio.timeout(LINGER_SECONDS):
                while await reader.read(READ_CHUNK_BYTES):
                    pass

    async def close(self, flush_timeout: float = 5.0) -> None:
        """Flush what is queued (waiting at most `flush_timeout` for a slow
        reader), then close the transport and wait for it."""
        self.flush()
        if not self._writer.is_closing():
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(flush_timeout):
                    await self._writer.drain()
            if self.linger_reader is not None:
                await self._linger(self.linger_reader)
            self._writer.close()
        # The peer may already have reset the connection; closed is closed.
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()


def flush_all(unflushed: dict[FrameWriter, None]) -> None:
    """Write now what every writer in `unflushed` has queued (see FrameWriter)."""
    for writer in list(unflushed):
        writer.flush()
