"""The RPC server's connections parse frames where the bytes arrive
(ledgermq/wire/server_connection.py): small frames in `data_received`,
anything else (large, compressed, waiting for budget) through the slow
reader on the same buffer, then fast again. Over real loopback sockets:
pipelined mixes and byte-by-byte input keep order and ids, the in-flight
cap holds, a Reply answers in the caller's pass (or not at all once the
connection closed) and leaves no reference cycle once answered, and the
frame budget is whole again afterwards."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest
import zstandard

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import NotLeaderError
from ledgermq.wire import (
    Connection,
    FrameDecoder,
    Request,
    RpcClient,
    RpcServer,
    decode_response,
    encode_frame,
    encode_request,
    hello_body,
)
from ledgermq.wire.codec import FLAG_ZSTD, HEADER
from ledgermq.wire.limits import SMALL_FRAME_BYTES, ServerLimits
from ledgermq.wire.rpc import Reply

pytestmark = pytest.mark.timeout(30)

ECHO, HOLD, REPLY = 920, 921, 922


def _frame(rid: int, code: int, body: Any, compress: bool = False) -> bytes:
    payload = encode_request(Request(rid, code, body))
    if not compress:
        return encode_frame(payload, compress_threshold=None)
    packed = zstandard.ZstdCompressor(write_content_size=True).compress(payload)
    return HEADER.pack(len(packed), FLAG_ZSTD) + packed


class _Handlers:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.held = 0
        self.replies: dict[Any, Reply] = {}

    def table(self) -> dict[int, Any]:
        async def echo(body: Any, conn: Connection) -> Any:
            return body

        async def hold(body: Any, conn: Connection) -> Any:
            self.held += 1
            await self.release.wait()
            return body

        def reply(body: Any, conn: Connection) -> Reply:
            answer = Reply()
            self.replies[body] = answer
            if body == "now":
                answer.resolve("at once")
            return answer

        return {ECHO: echo, HOLD: hold, REPLY: reply}


async def _serve(handlers: _Handlers, **kw: Any) -> RpcServer:
    server = RpcServer("test", handlers.table(), **kw)
    await server.start("127.0.0.1", 0)
    return server


async def _answers(reader: asyncio.StreamReader, n: int) -> dict[int, Any]:
    decoder, out = FrameDecoder(), {}
    while len(out) < n:
        data = await reader.read(1 << 20)
        assert data, "closed early"
        for payload in decoder.feed(data):
            response = decode_response(payload)
            assert response.status == 0, response
            out[response.id] = response.body
    return out


def test_a_pipelined_mix_of_small_large_and_compressed_frames_keeps_every_answer() -> None:
    """Small frames go through the fast path, a large and a compressed one
    through the slow reader, in one write and in order; every request is
    answered with its own body and the budget is whole again."""
    async def main() -> None:
        handlers = _Handlers()
        server = await _serve(handlers, limits=ServerLimits(max_frame_bytes=4 << 20))
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            bodies: dict[int, Any] = {1: hello_body("client")}
            frames = [_frame(1, RequestCode.HELLO, bodies[1])]
            for rid in range(2, 40):
                if rid % 10 == 0:
                    body: Any = bytes([rid]) * (SMALL_FRAME_BYTES + 1000)  # large
                    frames.append(_frame(rid, ECHO, body))
                elif rid % 7 == 0:
                    body = b"z" * 200_000  # compressed, decompressed is large
                    frames.append(_frame(rid, ECHO, body, compress=True))
                else:
                    body = f"small-{rid}"
                    frames.append(_frame(rid, ECHO, body))
                bodies[rid] = body
            writer.write(b"".join(frames))
            answers = await _answers(reader, len(bodies))
            assert {rid: body for rid, body in answers.items() if rid != 1} == {
                rid: body for rid, body in bodies.items() if rid != 1}
            writer.close()
            async with asyncio.timeout(5):
                while server.budget.used:
                    await asyncio.sleep(0.01)
        finally:
            await server.close(grace=1.0)

    loop.run(main())


def test_frames_arriving_a_byte_at_a_time_are_reassembled() -> None:
    async def main() -> None:
        handlers = _Handlers()
        server = await _serve(handlers)
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            data = _frame(1, RequestCode.HELLO, hello_body("client")) + b"".join(
                _frame(rid, ECHO, f"piece-{rid}") for rid in range(2, 6))
            for i in range(len(data)):
                writer.write(data[i : i + 1])
                await writer.drain()
                if i % 7 == 0:
                    await asyncio.sleep(0)
            answers = await _answers(reader, 5)
            assert [answers[rid] for rid in range(2, 6)] == [f"piece-{rid}" for rid in range(2, 6)]
            writer.close()
        finally:
            await server.close(grace=1.0)

    loop.run(main())


def test_the_in_flight_cap_stops_parsing_until_a_request_is_answered() -> None:
    """20 pipelined requests of a handler that holds them: only the cap's
    worth reach it; once released, all 20 are answered."""
    async def main() -> None:
        handlers = _Handlers()
        server = await _serve(handlers, max_inflight_per_connection=4)
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            writer.write(_frame(1, RequestCode.HELLO, hello_body("client")) + b"".join(
                _frame(rid, HOLD, rid) for rid in range(2, 22)))
            for _ in range(20):
                await asyncio.sleep(0.01)
            assert handlers.held == 4
            handlers.release.set()
            answers = await _answers(reader, 21)
            assert [answers[rid] for rid in range(2, 22)] == list(range(2, 22))
            assert handlers.held == 20
            writer.close()
        finally:
            await server.close(grace=1.0)

    loop.run(main())


def test_a_reply_answers_when_settled_and_never_after_the_connection_closed() -> None:
    async def main() -> None:
        handlers = _Handlers()
        server = await _serve(handlers)
        try:
            async with await RpcClient.connect(*server.address) as client:
                assert await client.request(REPLY, "now") == "at once"
                later = asyncio.ensure_future(client.request(REPLY, "later"))
                failing = asyncio.ensure_future(client.request(REPLY, "fail"))
                await client.request(ECHO, "sync")  # both reached their handler
                [conn] = server._connections
                assert set(conn.inflight) == {handlers.replies["later"], handlers.replies["fail"]}
                handlers.replies["fail"].fail(NotLeaderError("moved", leader="127.0.0.1:2"))
                with pytest.raises(NotLeaderError):
                    await failing
                handlers.replies["later"].resolve({"answer": 1})
                handlers.replies["later"].resolve("ignored: only the first outcome counts")
                assert await later == {"answer": 1}
                assert not conn.inflight
                orphan = asyncio.ensure_future(client.request(REPLY, "orphan"))
                await client.request(ECHO, "sync")
            with pytest.raises(Exception):  # noqa: B017 - the connection closed under it
                await orphan
            # The server cancelled the orphan's Reply when the connection
            # closed: settling it now sends nothing and frees nothing twice.
            async with asyncio.timeout(10):
                while server._connections:
                    await asyncio.sleep(0.01)
            assert handlers.replies["orphan"].done
            handlers.replies["orphan"].resolve("too late")
            assert server.budget.used == 0
        finally:
            await server.close(grace=1.0)

    loop.run(main())


def test_an_answered_reply_leaves_no_reference_cycle() -> None:
    """The server's callback on a Reply holds the Reply; once the answer is
    out the Reply lets go of it, so a request's objects are freed by
    reference counting. As a cycle each request left ~10 objects to the
    cyclic collector, whose full collections then took tens of milliseconds
    under load (the per-message path's p99)."""
    async def main() -> None:
        handlers = _Handlers()
        server = await _serve(handlers)
        try:
            async with await RpcClient.connect(*server.address) as client:
                gc.collect()
                gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept, not freed
                try:
                    assert await client.request(REPLY, "now") == "at once"  # settled, then bound
                    later = asyncio.ensure_future(client.request(REPLY, "later"))
                    await client.request(ECHO, "sync")
                    handlers.replies["later"].resolve("bound, then settled")
                    assert await later == "bound, then settled"
                    assert len(handlers.replies) == 2
                    handlers.replies.clear()  # the only references left, if no cycle
                    gc.collect()
                    cyclic = [o for o in gc.garbage if isinstance(o, Reply)]
                finally:
                    gc.set_debug(0)
                    gc.garbage.clear()
                assert cyclic == []
        finally:
            await server.close(grace=1.0)

    loop.run(main())
