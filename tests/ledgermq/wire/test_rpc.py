"""RpcServer / RpcClient over real loopback sockets, in one process."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    ConnectionClosedError,
    ErrorCode,
    FrameTooLargeError,
    InternalError,
    InvalidRequestError,
    MalformedFrameError,
    NoPermissionError,
    NotLeaderError,
    RequestTimeoutError,
    UnknownRequestError,
    UnsupportedVersionError,
)
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
    rpc,
)

ECHO, SLOW, FAIL, NOT_LEADER, WHO, BIG = 900, 901, 902, 903, 904, 905
# Plain functions that answer through a future (the per-message path).
LATER, CHECKED, RANDOM_NOW = 906, 907, 908
RANDOM = os.urandom(1 << 20)  # incompressible: answers stay their size on the wire


def _handlers(seen: list[Connection]) -> dict[int, Callable[[Any, Connection], Awaitable[Any]]]:
    async def echo(body: Any, conn: Connection) -> Any:
        seen.append(conn)
        return body

    async def slow(body: Any, conn: Connection) -> Any:
        # Waits for an event the test sets, not for a wall-clock delay.
        await body_events[body].wait()
        return body

    async def fail(body: Any, conn: Connection) -> Any:
        raise ValueError("handler bug")

    async def not_leader(body: Any, conn: Connection) -> Any:
        raise NotLeaderError("follower", leader="127.0.0.1:1234")

    async def who(body: Any, conn: Connection) -> Any:
        return {"role": conn.role, "version": conn.version, "name": conn.name}

    async def big(body: Any, conn: Connection) -> Any:
        return b"x" * body

    def later(body: Any, conn: Connection) -> asyncio.Future[Any]:
        # The test resolves it: with a body, an error, or by cancelling it.
        seen.append(conn)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        body_futures[body] = future
        return future

    def checked(body: Any, conn: Connection) -> asyncio.Future[Any]:
        if not isinstance(body, int):
            raise NotLeaderError("checked at once", leader="127.0.0.1:1")
        if body < 0:
            raise ValueError("a bug in a plain handler")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(body * 2)
        return future

    def random_now(body: Any, conn: Connection) -> asyncio.Future[Any]:
        calls.append(body)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(RANDOM[:body])
        return future

    return {ECHO: echo, SLOW: slow, FAIL: fail, NOT_LEADER: not_leader, WHO: who, BIG: big,
            LATER: later, CHECKED: checked, RANDOM_NOW: random_now}


body_events: dict[Any, asyncio.Event] = {}
body_futures: dict[Any, asyncio.Future[Any]] = {}
calls: list[Any] = []


def run_with_server(
    test: Callable[[RpcServer, int], Awaitable[None]], **kw: Any
) -> list[Connection]:
    seen: list[Connection] = []

    async def main() -> None:
        body_events.clear()
        body_futures.clear()
        calls.clear()
        server = RpcServer("test", _handlers(seen), **kw)
        _, port = await server.start("127.0.0.1", 0)
        try:
            await test(server, port)
        finally:
            await server.close(grace=2.0)

    loop.run(main())
    return seen


def test_handshake_and_ping() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port, role="broker", name="b1") as c:
            assert c.server_version == 1 and c.server_info["server"] == "test"
            assert await c.request(RequestCode.PING, {"x": 1}) == {"x": 1}
            assert await c.request(WHO) == {"role": "broker", "version": 1, "name": "b1"}

    run_with_server(t)


def test_concurrent_requests_complete_out_of_order_and_match_by_id() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as c:
            body_events["a"] = asyncio.Event()
            slow = asyncio.ensure_future(c.request(SLOW, "a"))
            # Later requests on the same connection are answered while the first waits.
            assert await asyncio.gather(*(c.request(ECHO, i) for i in range(20))) == list(
                range(20)
            )
            assert not slow.done()
            body_events["a"].set()
            assert await slow == "a"

    run_with_server(t)


def test_responses_to_concurrent_requests_are_batched_into_few_writes() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as c:
            await asyncio.gather(*(c.request(ECHO, i) for i in range(50)))

    seen = run_with_server(t)
    writer = seen[0].writer
    assert writer is not None and writer.frames == 51  # HELLO + 50 responses
    assert writer.writes < writer.frames


def test_errors_are_typed_and_the_connection_survives_them() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as c:
            with pytest.raises(UnknownRequestError, match="4242"):
                await c.request(4242)
            with pytest.raises(InternalError, match="handler bug"):
                await c.request(FAIL)
            with pytest.raises(NotLeaderError) as info:
                await c.request(NOT_LEADER)
            assert info.value.leader == "127.0.0.1:1234"
            assert await c.request(ECHO, "still here") == "still here"

    run_with_server(t)


def test_a_handler_may_answer_through_a_future_without_a_task() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as c:
            first = asyncio.ensure_future(c.request(LATER, "a"))
            second = asyncio.ensure_future(c.request(LATER, "b"))
            failing = asyncio.ensure_future(c.request(LATER, "c"))
            await c.request(ECHO, "sync")  # all three reached their handler
            [conn] = server._connections
            # What is in flight is the handler's own future: no task per request.
            assert set(conn.inflight) == set(body_futures.values())
            assert not any(isinstance(f, asyncio.Task) for f in conn.inflight)
            body_futures["b"].set_result({"answer": "b"})
            assert await second == {"answer": "b"}  # answered out of order
            assert not first.done()
            body_futures["c"].set_exception(NotLeaderError("moved", leader="127.0.0.1:2"))
            with pytest.raises(NotLeaderError) as info:
                await failing
            assert info.value.leader == "127.0.0.1:2"
            body_futures["a"].set_result("a")
            assert await first == "a"
            assert not conn.inflight
            # A plain handler's checks raise at once: typed errors, a bug is
            # INTERNAL, and the connection goes on.
            assert await c.request(CHECKED, 21) == 42
            with pytest.raises(NotLeaderError):
                await c.request(CHECKED, "x")
            with pytest.raises(InternalError):
                await c.request(CHECKED, -1)
            assert await c.request(CHECKED, 1) == 2

    run_with_server(t)


def _kernel_buffer_max(name: str) -> int:
    """The largest buffer TCP autotuning may give a socket (tcp_wmem/tcp_rmem's
    third field): what the kernel alone can hold of a connection's data."""
    with open(f"/proc/sys/net/ipv4/{name}") as f:
        return int(f.read().split()[2])


def test_the_server_stops_reading_while_its_answers_go_unread() -> None:
    """Answers from futures do not wait for the drain themselves: the read
    loop does, so a client that sends and never reads makes the server hold
    at most its in-flight cap of answers, not one per request it sent
    (beyond what the kernel's socket buffers take in, which depends on the
    machine: 32 MiB of receive buffer on one, so the client's is fixed small
    here and the server's send buffer is allowed for)."""
    requests, cap, size = 1000, 64, 64 << 10  # 64 MiB of answers if nothing held back

    async def t(server: RpcServer, port: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 << 10)  # no autotuning
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        received = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        in_kernel = (received + _kernel_buffer_max("tcp_wmem")) // size + 1
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(encode_frame(encode_request(Request(1, RequestCode.HELLO,
                                                         hello_body("client")))))
        writer.write(b"".join(encode_frame(encode_request(Request(i, RANDOM_NOW, size)))
                              for i in range(2, 2 + requests)))
        # Give the server every chance to run ahead: it must stall on its
        # unread answers, not on our requests (they are all sent).
        for _ in range(50):
            await asyncio.sleep(0.01)
        stalled_at = len(calls)
        assert stalled_at <= 2 * cap + in_kernel, (stalled_at, in_kernel)
        decoder, answered = FrameDecoder(), 0
        while answered < requests + 1:  # HELLO's answer and every request's
            data = await reader.read(1 << 20)
            assert data, "closed early"
            for payload in decoder.feed(data):
                assert decode_response(payload).status == 0
                answered += 1
        assert len(calls) == requests
        writer.close()

    run_with_server(t, max_inflight_per_connection=cap)


def test_timeout_then_late_response_is_discarded() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as c:
            body_events["late"] = asyncio.Event()
            with pytest.raises(RequestTimeoutError) as info:
                await c.request(SLOW, "late", timeout=0.05)
            assert info.value.code == ErrorCode.TIMEOUT
            body_events["late"].set()
            assert await c.request(ECHO, "next") == "next"

    run_with_server(t)


def test_version_and_role_are_checked_at_handshake() -> None:
    async def t(server: RpcServer, port: int) -> None:
        with pytest.raises(UnsupportedVersionError) as info:
            await RpcClient.connect("127.0.0.1", port, version=99)
        assert info.value.data == {"supported": [1]}
        with pytest.raises(NoPermissionError, match="role 'spy'"):
            await RpcClient.connect("127.0.0.1", port, role="spy")
        async with await RpcClient.connect("127.0.0.1", port) as c:
            assert await c.request(ECHO, 1) == 1

    run_with_server(t, accepted_roles=frozenset({"client"}))


def test_large_bodies_are_compressed_and_size_limits_enforced() -> None:
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port, compress_threshold=1024) as c:
            text = b"compressible " * 4000  # 52 kB: compressed on the way in and out
            assert await c.request(ECHO, text) == text
            # A response over the frame limit becomes an error; the connection lives.
            with pytest.raises(FrameTooLargeError, match="response"):
                await c.request(BIG, 100_000)
            assert await c.request(ECHO, "alive") == "alive"
            # A request that compresses small but would expand past the limit is
            # refused from its declared size, and that connection is closed.
            with pytest.raises(FrameTooLargeError, match="decompressed"):
                await c.request(ECHO, b"\x00" * 200_000)
            with pytest.raises(ConnectionClosedError):
                await c.request(ECHO, "closed")
        async with await RpcClient.connect("127.0.0.1", port) as other:
            assert await other.request(ECHO, "others fine") == "others fine"

    run_with_server(t, max_frame_bytes=64 * 1024)


def test_free_heap_is_returned_after_large_frames_at_most_once_a_second() -> None:
    # A trim walks glibc's free lists; under a load of large requests the
    # frame budget drains after each one, so the trims are spaced out, and a
    # drain inside the interval is trimmed when the interval ends.
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as c:
            assert await c.request(ECHO, "small") == "small"
            assert server.trims == 0  # small frames never trim
            large = RANDOM[:200_000]
            assert await c.request(ECHO, large) == large
            assert server.trims == 1
            for _ in range(5):
                assert await c.request(ECHO, large) == large
            assert server.trims == 1  # within the interval: deferred, not done
            await asyncio.sleep(rpc.TRIM_INTERVAL_S + 0.3)
            assert server.trims == 2  # the deferred trim ran once
            await asyncio.sleep(rpc.TRIM_INTERVAL_S + 0.3)
            assert server.trims == 2  # nothing large since: nothing to trim

    run_with_server(t)


def test_graceful_close_answers_in_flight_requests_first() -> None:
    async def t(server: RpcServer, port: int) -> None:
        c = await RpcClient.connect("127.0.0.1", port)
        body_events["inflight"] = asyncio.Event()
        pending = asyncio.ensure_future(c.request(SLOW, "inflight"))
        await c.request(ECHO, "sync")  # the SLOW request has reached the server
        closing = asyncio.ensure_future(server.close(grace=5.0))
        await asyncio.sleep(0)
        body_events["inflight"].set()
        assert await pending == "inflight"
        await closing
        with pytest.raises(ConnectionClosedError):
            await c.request(ECHO, "after close")
        await c.close()

    run_with_server(t)


def test_request_before_hello_is_refused_and_closed() -> None:
    async def t(server: RpcServer, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(encode_frame(encode_request(Request(5, ECHO, "x"))))
        data = await reader.read()  # until the server closes
        [payload] = FrameDecoder().feed(data)
        resp = decode_response(payload)
        assert resp.id == 5 and resp.status == ErrorCode.HANDSHAKE_REQUIRED
        writer.close()

    run_with_server(t)


def test_malformed_frame_fails_pending_requests_with_the_servers_reason() -> None:
    async def t(server: RpcServer, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        hello = encode_request(Request(1, RequestCode.HELLO, hello_body("client")))
        ok = encode_request(Request(2, ECHO, "before"))
        writer.write(encode_frame(hello) + encode_frame(ok) + struct.pack(">IB", 3, 0) + b"\xc1xx")
        data = await reader.read()
        responses = [decode_response(p) for p in FrameDecoder().feed(data)]
        # The request read before the bad frame is still answered, then the error.
        assert [(r.id, r.status) for r in responses] == [
            (1, 0),
            (2, 0),
            (0, ErrorCode.MALFORMED_FRAME),
        ]
        writer.close()
        async with await RpcClient.connect("127.0.0.1", port) as c:
            assert await c.request(ECHO, "others fine") == "others fine"

    run_with_server(t)


@pytest.mark.parametrize("answer", [b"HTTP/1.1 400 Bad Request\r\n\r\n",
                                    b"SSH-2.0-OpenSSH_9.2\r\n"], ids=["http", "ssh"])
def test_another_kind_of_server_is_named_as_not_a_ledgermq_server(answer: bytes) -> None:
    """A client pointed at the admin HTTP port (or anything else) used to
    report only "MALFORMED_FRAME: unknown frame flags 0x2f"."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(64)
        writer.write(answer)
        await writer.drain()
        await reader.read()  # until the client hangs up
        writer.close()

    async def t() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(MalformedFrameError) as err:
                await RpcClient.connect("127.0.0.1", port, timeout=5.0)
            assert f"127.0.0.1:{port} does not answer as a LedgerMQ server" in err.value.message
            assert "not a LedgerMQ frame: " in err.value.message
        finally:
            server.close()
            await server.wait_closed()

    loop.run(t())


def test_a_value_msgpack_cannot_carry_is_an_invalid_request_never_sent() -> None:
    """A pull at offset 2**64 ended in a bare TypeError from the encoder."""
    async def t(server: RpcServer, port: int) -> None:
        async with await RpcClient.connect("127.0.0.1", port) as c:
            for body in ({"offset": 2**64}, {"offset": -(2**63) - 1}, {"x": object()}):
                with pytest.raises(InvalidRequestError, match="cannot be encoded as msgpack"):
                    await c.request(ECHO, body)
            assert await c.request(ECHO, "still fine") == "still fine"

    run_with_server(t)


def test_server_on_port_zero_reports_its_port() -> None:
    async def t(server: RpcServer, port: int) -> None:
        host, bound = server.address
        assert host == "127.0.0.1" and bound == port != 0
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass

    run_with_server(t)


def test_silent_connection_is_closed_after_the_handshake_timeout() -> None:
    async def t(server: RpcServer, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = await reader.read()  # the server speaks first, then closes
        [payload] = FrameDecoder().feed(data)
        resp = decode_response(payload)
        assert (resp.id, resp.status) == (0, ErrorCode.HANDSHAKE_REQUIRED)
        writer.close()

    run_with_server(t, handshake_timeout=0.1)


@pytest.mark.parametrize("close_loop", [False, True], ids=["loop-dropped", "loop-closed"])
def test_client_abandoned_with_its_loop_lets_go_without_awaiting(close_loop: bool) -> None:
    # A connect still waiting for its HELLO answer, and its reader task, when
    # their loop is dropped or closed without cancelling them: the garbage
    # collector closes the coroutines, which must let go at once instead of
    # awaiting a cleanup ("coroutine ignored GeneratorExit" in CI) or
    # scheduling one on a closed loop ("Event loop is closed").
    import gc
    import sys

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts the connection, never answers the HELLO
    port = silent.getsockname()[1]
    unraisable: list[BaseException | None] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda info: unraisable.append(info.exc_value)
    try:
        abandoned = asyncio.new_event_loop()
        task = abandoned.create_task(RpcClient.connect("127.0.0.1", port, timeout=30))
        abandoned.run_until_complete(asyncio.sleep(0.2))
        assert not task.done()  # waiting for the HELLO answer
        if close_loop:
            abandoned.close()
        del task, abandoned
        gc.collect()
    finally:
        sys.unraisablehook = previous
        silent.close()
    assert not [e for e in unraisable if isinstance(e, RuntimeError)], unraisable
