"""RpcServer's resource bounds over real loopback sockets, in one process.

Frame memory (the server-wide budget, held until a request is answered,
compressed frames counted at their decompressed size before decompressing),
read deadlines, the idle timeout, the pre-handshake frame cap and connection
caps: each refusal comes with its error code, the server stays up, and the
budget is whole again once the connections are gone.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import zstandard

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import ErrorCode, ServiceUnavailableError
from ledgermq.wire import Connection, Request, RpcClient, RpcServer, encode_request
from ledgermq.wire.codec import FLAG_ZSTD, HEADER
from ledgermq.wire.limits import ByteBudget, ServerLimits
from tests.security.raw_client import Raw
from tests.security.raw_client import bomb as _bomb
from tests.security.raw_client import frame as _frame

pytestmark = pytest.mark.timeout(30)

HOLD = 910  # a handler that holds its request until the test lets it go
MIB = 1 << 20


async def _server(limits: ServerLimits, **kw: object) -> tuple[RpcServer, asyncio.Event]:
    release = asyncio.Event()

    async def hold(body: object, conn: Connection) -> object:
        await release.wait()
        return len(body) if isinstance(body, bytes) else body

    server = RpcServer("test", {HOLD: hold}, limits=limits, **kw)  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0)
    return server, release


async def _until(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        while not predicate():
            await asyncio.sleep(0.01)


def test_byte_budget_reserve_order_and_cancellation() -> None:
    async def main() -> None:
        budget = ByteBudget(100, reserve=20)
        assert budget.try_acquire(80)  # large frames may use up to 80
        assert not budget.try_acquire(1)
        assert budget.try_acquire(20, small=True)  # the reserve is for small ones
        first = asyncio.create_task(budget.acquire(50))
        second = asyncio.create_task(budget.acquire(10))
        cancelled = asyncio.create_task(budget.acquire(5))
        await asyncio.sleep(0)
        cancelled.cancel()
        budget.release(80)
        await asyncio.sleep(0)
        assert first.done() and second.done() and cancelled.cancelled()
        assert budget.used == 80
        budget.release(80)
        assert budget.used == 0 and budget.peak == 100
    loop.run(main())


def test_compressed_frames_reserve_their_decompressed_size_until_answered() -> None:
    """A PING-style bomb: 500 bytes on the wire, 1 MiB once decompressed.
    Requests in flight hold their decompressed bytes, so at most
    budget / 1 MiB of them exist at once; the others wait, then all are answered."""
    async def main() -> None:
        limits = ServerLimits(max_frame_bytes=2 * MIB, frame_memory_budget_bytes=4 * MIB)
        server, release = await _server(limits)
        try:
            clients = [await Raw.open(server.address) for _ in range(8)]
            for i, raw in enumerate(clients):
                raw.send(_bomb(MIB - 100, rid=i + 2, code=HOLD))
            await _until(lambda: server.budget.used > 3 * MIB, "bombs held")
            await asyncio.sleep(0.2)  # let any that could get past the budget do so
            assert server.budget.used <= limits.frame_memory_budget_bytes
            assert server.budget.peak <= limits.frame_memory_budget_bytes
            release.set()
            answers = [await raw.response() for raw in clients]
            assert all(a.ok and a.body == MIB - 100 for a in answers)
            for raw in clients:
                raw.close()
            await _until(lambda: server.connection_count == 0, "closed")
            assert server.budget.used == 0
        finally:
            await server.close()
    loop.run(main())


def test_a_decompression_bomb_over_the_limit_is_refused_before_decompressing() -> None:
    async def main() -> None:
        limits = ServerLimits(max_frame_bytes=MIB, frame_memory_budget_bytes=4 * MIB)
        server, _ = await _server(limits)
        try:
            raw = await Raw.open(server.address)
            raw.send(_bomb(15 * MIB))
            assert await raw.closed_with() == ErrorCode.FRAME_TOO_LARGE
            # A header that understates the content: zstd refuses to write past it.
            payload = encode_request(Request(2, RequestCode.PING, b"\0" * 200_000))
            packed = bytearray(zstandard.ZstdCompressor(write_content_size=True)
                               .compress(payload))
            descriptor = packed[4]
            assert descriptor >> 6 == 2, "a 4-byte content size field"
            at = 5 + (0 if descriptor & 0x20 else 1) + (0, 1, 2, 4)[descriptor & 3]
            packed[at:at + 4] = (100_000).to_bytes(4, "little")
            assert zstandard.frame_content_size(bytes(packed)) == 100_000
            raw = await Raw.open(server.address)
            raw.send(HEADER.pack(len(packed), FLAG_ZSTD) + bytes(packed))
            assert await raw.closed_with() == ErrorCode.MALFORMED_FRAME
            assert server.budget.used == 0
            async with await RpcClient.connect(*server.address) as client:
                assert await client.request(RequestCode.PING, "still up") == "still up"
        finally:
            await server.close()
    loop.run(main())


def test_partial_frames_hold_only_what_arrived_and_small_frames_keep_flowing() -> None:
    async def main() -> None:
        limits = ServerLimits(max_frame_bytes=2 * MIB, frame_memory_budget_bytes=4 * MIB,
                              frame_read_timeout=1.0)
        server, _ = await _server(limits)
        try:
            # A header announcing 2 MiB costs the server nothing until bytes arrive.
            cheap = await Raw.open(server.address)
            cheap.send(HEADER.pack(2 * MIB, 0))
            await asyncio.sleep(0.1)
            assert server.budget.used <= 256 * 1024
            # Large partial frames fill the large-frame part of the budget...
            floods = [await Raw.open(server.address) for _ in range(4)]
            for raw in floods:
                raw.send(HEADER.pack(2 * MIB, 0) + b"x" * (2 * MIB - 10))
            await _until(lambda: server.budget.used >= 3 * MIB, "budget filled")
            assert server.budget.used <= limits.frame_memory_budget_bytes
            # ...and normal requests still get through on the reserve.
            async with await RpcClient.connect(*server.address) as client:
                assert await client.request(RequestCode.PING, b"p" * 1000) == b"p" * 1000
            # Then the deadline ends every partial frame: TIMEOUT for those
            # that were being read, SERVICE_UNAVAILABLE for those that waited
            # for room.
            statuses = {await raw.closed_with() for raw in [cheap, *floods]}
            assert statuses <= {ErrorCode.TIMEOUT, ErrorCode.SERVICE_UNAVAILABLE}
            assert ErrorCode.TIMEOUT in statuses
            await _until(lambda: server.connection_count == 0, "closed")
            assert server.budget.used == 0
            assert server.limit_events.get("frame_read_timeout", 0) >= 1
        finally:
            await server.close()
    loop.run(main())


def test_frames_before_the_handshake_are_small() -> None:
    async def main() -> None:
        server, _ = await _server(ServerLimits())
        try:
            raw = await Raw.open(server.address, hello=False)
            raw.send(HEADER.pack(15 * MIB, 0) + b"x" * 1000)
            assert await raw.closed_with() == ErrorCode.FRAME_TOO_LARGE
            assert server.budget.used == 0
        finally:
            await server.close()
    loop.run(main())


def test_slowloris_header_and_body_get_timeout() -> None:
    async def main() -> None:
        server, _ = await _server(ServerLimits(frame_read_timeout=0.5))
        try:
            header_only = await Raw.open(server.address)
            header_only.send(HEADER.pack(100, 0)[:2])
            body = await Raw.open(server.address)
            body.send(HEADER.pack(100, 0) + b"\x80")

            async def drip() -> None:
                # One byte at a time keeps the socket busy, never the frame whole.
                for _ in range(40):
                    body.send(b"\x00")
                    await asyncio.sleep(0.05)

            dripping = asyncio.create_task(drip())
            assert await header_only.closed_with() == ErrorCode.TIMEOUT
            assert await body.closed_with() == ErrorCode.TIMEOUT
            dripping.cancel()
            assert server.limit_events["frame_read_timeout"] == 2
        finally:
            await server.close()
    loop.run(main())


def test_idle_connections_are_closed_but_long_requests_are_activity() -> None:
    async def main() -> None:
        server, release = await _server(ServerLimits(idle_timeout=0.3))
        try:
            idle = await Raw.open(server.address)
            busy = await Raw.open(server.address)
            busy.send(_frame(HOLD, "long poll", rid=5))
            assert await idle.closed_with() == ErrorCode.TIMEOUT
            assert server.limit_events["idle_timeout"] == 1
            # Several idle periods later the busy connection is still open.
            await asyncio.sleep(1.0)
            release.set()
            answer = await busy.response()
            assert answer.id == 5 and answer.body == "long poll"
            assert await busy.closed_with() == ErrorCode.TIMEOUT
        finally:
            await server.close()
    loop.run(main())


def test_connection_caps_per_address_and_total(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        limits = ServerLimits(max_connections=6, max_connections_per_address=3)
        server, _ = await _server(limits)
        try:
            mine = [await Raw.open(server.address, source="127.0.0.2") for _ in range(3)]
            extra = await Raw.open(server.address, hello=False, source="127.0.0.2")
            assert await extra.closed_with() == ErrorCode.SERVICE_UNAVAILABLE
            # Another address is not affected by the first one's cap...
            others = [await Raw.open(server.address, source="127.0.0.3") for _ in range(3)]
            # ...until the total is reached.
            with pytest.raises(ServiceUnavailableError, match="max_connections 6"):
                await RpcClient.connect(*server.address)
            assert server.limit_events == {"connections_per_address": 1,
                                           "connections_total": 1}
            for raw in [*mine, *others]:
                raw.close()
            await _until(lambda: server.caps.open == 0, "released")
            async with await RpcClient.connect(*server.address) as client:
                assert await client.request(RequestCode.PING, 1) == 1
        finally:
            await server.close()
    with caplog.at_level(logging.WARNING, logger="ledgermq.wire.rpc"):
        loop.run(main())
    assert "too many connections from 127.0.0.2" in caplog.text
    assert "max_connections 6" in caplog.text


def test_server_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        ServerLimits(max_frame_bytes=16 * MIB, frame_memory_budget_bytes=16 * MIB)
    with pytest.raises(ValueError):
        ServerLimits(max_connections=4, max_connections_per_address=5)
    with pytest.raises(ValueError):
        ServerLimits(idle_timeout=0)
