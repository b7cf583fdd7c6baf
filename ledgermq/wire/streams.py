"""Frames over asyncio streams: `read_frame` on a StreamReader, batched writes.

`read_frame` checks the header before reading the payload, so an oversized
length is refused without buffering it. Writes are batched because Python pays
per call, not per byte: `write_frames` sends many frames with one write, and
`FrameWriter` coalesces frames queued by concurrent tasks during one event-loop
iteration into a single transport write.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from ledgermq.base.errors import MalformedFrameError
from ledgermq.wire.codec import (
    DEFAULT_COMPRESS_THRESHOLD,
    DEFAULT_MAX_FRAME_BYTES,
    HEADER_SIZE,
    decode_header,
    decode_payload,
    encode_frame,
    encode_frames,
)


async def read_frame(
    reader: asyncio.StreamReader, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> bytes | None:
    """Read one frame's (decompressed) payload; None on a clean EOF between frames.

    Raises MalformedFrameError if the stream ends inside a frame, and
    FrameTooLargeError as soon as a header announces too many bytes.
    """
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


class FrameWriter:
    """Batching frame writer shared by the tasks of one connection.

    `send` only queues; the first `send` of a loop iteration schedules a flush
    with `call_soon`, so every frame queued before the loop next runs
    callbacks goes out in one `write`. `drain` applies the transport's
    backpressure to the caller.
    """

    def __init__(
        self,
        writer: asyncio.StreamWriter,
        *,
        compress_threshold: int | None = DEFAULT_COMPRESS_THRESHOLD,
    ) -> None:
        self._writer = writer
        self._compress_threshold = compress_threshold
        self._pending: list[bytes] = []
        self._scheduled = False
        self.writes = 0  # transport writes issued; lets tests observe batching
        self.frames = 0

    @property
    def closing(self) -> bool:
        return self._writer.is_closing()

    def send(self, payload: bytes) -> None:
        """Queue one payload; silently dropped if the connection is already closing
        (the peer is gone, so nobody could read it)."""
        if self._writer.is_closing():
            return
        self._pending.append(encode_frame(payload, compress_threshold=self._compress_threshold))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write everything queued now, in one write."""
        self._scheduled = False
        if not self._pending:
            return
        data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
        self.frames += len(self._pending)
        self._pending.clear()
        if self._writer.is_closing():
            return
        self._writer.write(data)
        self.writes += 1

    async def drain(self) -> None:
        await self._writer.drain()

    async def close(self, flush_timeout: float = 5.0) -> None:
        """Flush what is queued (waiting at most `flush_timeout` for a slow
        reader), then close the transport and wait for it."""
        self.flush()
        if not self._writer.is_closing():
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(flush_timeout):
                    await self._writer.drain()
            self._writer.close()
        # The peer may already have reset the connection; closed is closed.
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
