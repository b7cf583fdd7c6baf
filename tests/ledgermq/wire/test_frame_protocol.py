"""FrameProtocol over real loopback sockets: the handshake mode reads one
frame at a time under its own cap, the serving mode hands every frame to a
callback where it arrives, nothing is parsed ahead of the mode that reads
it, and a bad frame or a failing callback closes that connection only."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from ledgermq.base.errors import FrameTooLargeError, MalformedFrameError
from ledgermq.base.loop import run
from ledgermq.wire.codec import HEADER, encode_frame
from ledgermq.wire.frame_protocol import FrameProtocol

pytestmark = pytest.mark.timeout(30)

Serve = Callable[[FrameProtocol], Awaitable[None]]


async def _with_server(serve: Serve, client: Callable[[asyncio.StreamWriter], Awaitable[None]],
                       pending_max: int = 64 * 1024) -> list[BaseException]:
    """Run `serve` on the accepted connection while `client` writes; the
    errors `serve` raised."""
    loop = asyncio.get_running_loop()
    errors: list[BaseException] = []
    done: list[asyncio.Task[None]] = []

    async def guarded(conn: FrameProtocol) -> None:
        try:
            await serve(conn)
        except Exception as exc:
            errors.append(exc)
        finally:
            conn.close()

    server = await loop.create_server(
        lambda: FrameProtocol(lambda c: done.append(loop.create_task(guarded(c))), pending_max),
        "127.0.0.1", 0)
    try:
        host, port = server.sockets[0].getsockname()[:2]
        _, writer = await asyncio.open_connection(host, port)
        await client(writer)
        async with asyncio.timeout(10):
            while not done:
                await asyncio.sleep(0.01)
            await asyncio.gather(*done)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    return errors


def test_handshake_frames_then_served_frames_in_order_including_those_sent_early() -> None:
    got: list[bytes] = []

    async def serve(conn: FrameProtocol) -> None:
        assert await conn.next_frame(16) == b"hello"
        assert await conn.next_frame(16) == b"proof"
        # Everything after the handshake was sent at once: it waited, unparsed
        # (a 1000-byte frame would have broken the handshake's 16-byte cap).
        await asyncio.sleep(0.1)
        conn.serve(got.append, 4096)
        async with asyncio.timeout(5):
            while len(got) < 5:
                await asyncio.sleep(0.01)

    async def client(writer: asyncio.StreamWriter) -> None:
        frames = [b"hello", b"proof", b"a" * 1000, b"b", b""]
        data = b"".join(encode_frame(f, compress_threshold=None) for f in frames)
        writer.write(data)
        # More, cut inside a header and inside a body.
        late = encode_frame(b"c" * 300, compress_threshold=None) + encode_frame(b"d")
        for cut in (2, 150, len(late)):
            await asyncio.sleep(0.3 if cut == 2 else 0.02)
            writer.write(late[:cut])
            late = late[cut:]
            if not late:
                break
        await writer.drain()

    async def main() -> None:
        assert await _with_server(serve, client) == []
        assert got == [b"a" * 1000, b"b", b"", b"c" * 300, b"d"]

    run(main())


def test_a_handshake_frame_over_its_cap_is_refused_before_its_body() -> None:
    async def serve(conn: FrameProtocol) -> None:
        await conn.next_frame(64)

    async def client(writer: asyncio.StreamWriter) -> None:
        writer.write(HEADER.pack(10_000_000, 0) + b"x" * 100)
        await writer.drain()

    async def main() -> None:
        [error] = await _with_server(serve, client)
        assert isinstance(error, FrameTooLargeError)

    run(main())


def test_eof_inside_a_handshake_frame_is_malformed_and_between_frames_is_none() -> None:
    seen: list[object] = []

    async def serve(conn: FrameProtocol) -> None:
        seen.append(await conn.next_frame(64))
        seen.append(await conn.next_frame(64))

    async def client(writer: asyncio.StreamWriter) -> None:
        writer.write(encode_frame(b"one", compress_threshold=None) + HEADER.pack(10, 0) + b"abc")
        await writer.drain()
        writer.close()

    async def clean(writer: asyncio.StreamWriter) -> None:
        writer.write(encode_frame(b"one", compress_threshold=None))
        await writer.drain()
        writer.close()

    async def main() -> None:
        [error] = await _with_server(serve, client)
        assert isinstance(error, MalformedFrameError)
        assert seen == [b"one"]
        seen.clear()
        assert await _with_server(serve, clean) == []
        assert seen == [b"one", None]

    run(main())


@pytest.mark.parametrize("fault", ["oversized", "bad flags", "callback raises"])
def test_a_bad_frame_or_a_failing_callback_closes_the_connection_with_the_error(
        fault: str) -> None:
    got: list[bytes] = []
    ended: list[BaseException | None] = []

    def on_frame(payload: bytes) -> None:
        if payload == b"boom":
            raise ValueError("the handler refused it")
        got.append(payload)

    async def serve(conn: FrameProtocol) -> None:
        conn.serve(on_frame, 1024)
        ended.append(await conn.wait_closed())

    bad = {"oversized": HEADER.pack(2048, 0) + b"x" * 10,
           "bad flags": HEADER.pack(1, 0x40) + b"x",
           "callback raises": encode_frame(b"boom", compress_threshold=None)}[fault]

    async def client(writer: asyncio.StreamWriter) -> None:
        writer.write(encode_frame(b"ok", compress_threshold=None) + bad
                     + encode_frame(b"never", compress_threshold=None))
        await writer.drain()

    async def main() -> None:
        assert await _with_server(serve, client) == []
        assert got == [b"ok"]
        [error] = ended
        expected = ValueError if fault == "callback raises" else (
            FrameTooLargeError if fault == "oversized" else MalformedFrameError)
        assert isinstance(error, expected)

    run(main())


def test_reading_pauses_while_unread_handshake_bytes_exceed_the_bound() -> None:
    """A peer that floods before its handshake is read holds at most about
    `pending_max` bytes (plus one socket read) of this process's memory."""
    held: list[int] = []

    async def serve(conn: FrameProtocol) -> None:
        await asyncio.sleep(0.5)  # not reading: the flood piles up
        held.append(len(conn._buffer))
        assert await conn.next_frame(64) == b"hello"

    async def client(writer: asyncio.StreamWriter) -> None:
        writer.write(encode_frame(b"hello", compress_threshold=None) + b"\0" * (8 << 20))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await writer.drain()  # the server stopped reading

    async def main() -> None:
        assert await _with_server(serve, client, pending_max=16 * 1024) == []
        assert held[0] <= 16 * 1024 + 512 * 1024

    run(main())
