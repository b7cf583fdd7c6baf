"""The NameServer as a real subprocess: routes, expiry, term ordering, two
independent NameServers, clean shutdown, and bad input over real sockets."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgpack
import pytest
from namesrv_harness import REPO, NameServerProcess, ledgermq_command

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    ErrorCode,
    InvalidRequestError,
    UnknownBrokerError,
    UnknownTopicError,
)
from ledgermq.wire import (
    FrameDecoder,
    Request,
    Response,
    RpcClient,
    decode_response,
    encode_frame,
    encode_request,
    hello_body,
)

T = TypeVar("T")


def registration(
    node: str, role: str, term: int, topics: dict[str, int] | None = None, group: str = "g1"
) -> dict[str, Any]:
    return {
        "cluster": "c1",
        "group": group,
        "node_id": node,
        "address": f"127.0.0.1:{20000 + int(node[1:])}",
        "role": role,
        "term": term,
        "topics": {t: {"queues": q, "perm": 6} for t, q in (topics or {"orders": 4}).items()},
    }


def with_client(ns: NameServerProcess, fn: Callable[[RpcClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with await RpcClient.connect(ns.host, ns.port, role="broker") as client:
            return await fn(client)

    return loop.run(main())


async def poll_until(
    check: Callable[[], Awaitable[bool]], timeout: float = 20.0, what: str = "condition"
) -> None:
    """Poll `check` until it holds; fail after `timeout` (a bound, not an expectation)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def leader_of(route: dict[str, Any]) -> str | None:
    leader = route["groups"][0]["leader"]
    return leader["node_id"] if leader else None


# --------------------------------------------------------------------- behaviour


def test_register_route_and_cluster(namesrv: NameServerProcess) -> None:
    async def t(c: RpcClient) -> None:
        ack = await c.request(RequestCode.REGISTER_BROKER, registration("n0", "leader", 1))
        assert ack == {
            "accepted_role": "leader",
            "stale": False,
            "leader": "n0",
            "leader_address": "127.0.0.1:20000",
            "leader_term": 1,
        }
        await c.request(RequestCode.REGISTER_BROKER, registration("n1", "follower", 1))
        route = await c.request(RequestCode.GET_ROUTE, {"topic": "orders"})
        [group] = route["groups"]
        assert (group["group"], group["queues"], leader_of(route)) == ("g1", 4, "n0")
        assert group["leader"]["address"] == "127.0.0.1:20000"
        assert [n["node_id"] for n in group["nodes"]] == ["n0", "n1"]
        view = await c.request(RequestCode.GET_CLUSTER)
        assert view["clusters"] == {"c1": ["g1"]}
        assert await c.request(RequestCode.BROKER_HEARTBEAT, {"group": "g1", "node_id": "n1"}) == {}
        with pytest.raises(UnknownBrokerError):
            await c.request(RequestCode.BROKER_HEARTBEAT, {"group": "g1", "node_id": "n9"})
        removed = await c.request(RequestCode.UNREGISTER_BROKER, {"group": "g1", "node_id": "n1"})
        assert removed == {"removed": True}

    with_client(namesrv, t)


def test_silent_broker_expires(namesrv_factory: Callable[..., NameServerProcess]) -> None:
    ns = namesrv_factory(expiry_ms=300)

    async def t(c: RpcClient) -> None:
        await c.request(RequestCode.REGISTER_BROKER, registration("n0", "leader", 1))
        assert leader_of(await c.request(RequestCode.GET_ROUTE, {"topic": "orders"})) == "n0"

        async def gone() -> bool:
            try:
                await c.request(RequestCode.GET_ROUTE, {"topic": "orders"})
            except UnknownTopicError:
                return True
            return False

        await poll_until(gone, what="the silent broker to expire")
        # A heartbeat from the expired broker tells it to register again.
        with pytest.raises(UnknownBrokerError):
            await c.request(RequestCode.BROKER_HEARTBEAT, {"group": "g1", "node_id": "n0"})

    with_client(ns, t)


def test_term_ordering_over_the_wire(namesrv: NameServerProcess) -> None:
    async def t(c: RpcClient) -> None:
        await c.request(RequestCode.REGISTER_BROKER, registration("n0", "leader", 2))
        await c.request(RequestCode.REGISTER_BROKER, registration("n1", "follower", 2))
        # n1 wins an election at term 3 and re-registers at once.
        ack = await c.request(RequestCode.REGISTER_BROKER, registration("n1", "leader", 3))
        assert ack["stale"] is False and ack["leader"] == "n1"
        route = await c.request(RequestCode.GET_ROUTE, {"topic": "orders"})
        assert leader_of(route) == "n1"
        assert {n["node_id"]: n["role"] for n in route["groups"][0]["nodes"]} == {
            "n0": "follower",
            "n1": "leader",
        }
        # The deposed n0, partitioned from its group, still claims term 2.
        ack = await c.request(RequestCode.REGISTER_BROKER, registration("n0", "leader", 2))
        assert ack["stale"] is True and ack["accepted_role"] == "follower"
        assert (ack["leader"], ack["leader_address"], ack["leader_term"]) == (
            "n1",
            "127.0.0.1:20001",
            3,
        )
        route = await c.request(RequestCode.GET_ROUTE, {"topic": "orders"})
        assert leader_of(route) == "n1"

    with_client(namesrv, t)


def test_two_nameservers_are_independent(
    namesrv_factory: Callable[..., NameServerProcess],
) -> None:
    a, b = namesrv_factory(), namesrv_factory()
    assert a.port != b.port

    async def main() -> None:
        ca = await RpcClient.connect(a.host, a.port, role="broker")
        cb = await RpcClient.connect(b.host, b.port, role="broker")
        try:
            # A broker registers with every NameServer.
            for c in (ca, cb):
                await c.request(RequestCode.REGISTER_BROKER, registration("n0", "leader", 1))
            # A topic created while B was unreachable reaches only A.
            await ca.request(
                RequestCode.REGISTER_BROKER,
                registration("n0", "leader", 1, {"orders": 4, "payments": 2}),
            )
            assert (await ca.request(RequestCode.GET_ROUTE, {"topic": "payments"}))["groups"]
            with pytest.raises(UnknownTopicError):
                await cb.request(RequestCode.GET_ROUTE, {"topic": "payments"})
            # Unregistering from A does not touch B: they never talk to each other.
            await ca.request(RequestCode.UNREGISTER_BROKER, {"group": "g1", "node_id": "n0"})
            with pytest.raises(UnknownTopicError):
                await ca.request(RequestCode.GET_ROUTE, {"topic": "orders"})
            route = await cb.request(RequestCode.GET_ROUTE, {"topic": "orders"})
            assert leader_of(route) == "n0"
        finally:
            await ca.close()
            await cb.close()

    loop.run(main())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_nameserver_cleanly(
    namesrv_factory: Callable[..., NameServerProcess], sig: int
) -> None:
    ns = namesrv_factory()
    with_client(
        ns,
        lambda c: c.request(RequestCode.REGISTER_BROKER, registration("n0", "leader", 1)),
    )
    assert ns.stop(sig) == 0
    assert "namesrv stopped" in "".join(ns.output)
    assert "Traceback" not in "".join(ns.output)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((ns.host, ns.port), timeout=5).close()


# --------------------------------------------------------------------- bad input


class RawConn:
    """A blocking socket that speaks frames by hand, to send what a client would not."""

    def __init__(self, ns: NameServerProcess) -> None:
        self.sock = socket.create_connection((ns.host, ns.port), timeout=15)
        self.decoder = FrameDecoder()
        self.frames: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, rid: int, code: int, body: Any = None) -> None:
        self.send(encode_frame(encode_request(Request(rid, code, body))))

    def hello(self, version: int = 1) -> Response:
        self.request(1, RequestCode.HELLO, hello_body("client", version))
        return self.recv()

    def recv(self) -> Response:
        while not self.frames:
            data = self.sock.recv(65536)
            assert data, "connection closed before a response"
            self.frames += self.decoder.feed(data)
        return decode_response(self.frames.pop(0))

    def assert_closed_by_server(self) -> None:
        assert not self.frames
        assert self.sock.recv(65536) == b"", "server should have closed the connection"

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def seeded(namesrv: NameServerProcess) -> NameServerProcess:
    """A NameServer holding one route, to show bad input never disturbs it."""
    with_client(
        namesrv,
        lambda c: c.request(RequestCode.REGISTER_BROKER, registration("n0", "leader", 7)),
    )
    return namesrv


def assert_server_healthy(ns: NameServerProcess) -> None:
    async def check(c: RpcClient) -> None:
        route = await c.request(RequestCode.GET_ROUTE, {"topic": "orders"})
        assert leader_of(route) == "n0" and route["groups"][0]["leader"]["term"] == 7

    with_client(ns, check)
    assert ns.proc.poll() is None


def test_truncated_frame_then_close(seeded: NameServerProcess) -> None:
    bystander = RawConn(seeded)
    assert bystander.hello().ok
    bad = RawConn(seeded)
    assert bad.hello().ok
    bad.send(struct.pack(">IB", 100, 0) + b"only ten b")
    bad.sock.shutdown(socket.SHUT_WR)  # the frame will never be completed
    err = bad.recv()
    assert (err.id, err.status) == (0, ErrorCode.MALFORMED_FRAME)
    assert "inside a frame" in (err.error or "")
    bad.assert_closed_by_server()
    bad.close()
    # The connection that was open all along still works.
    bystander.request(2, RequestCode.GET_ROUTE, {"topic": "orders"})
    assert bystander.recv().ok
    bystander.close()
    assert_server_healthy(seeded)


def test_garbage_bytes(seeded: NameServerProcess) -> None:
    conn = RawConn(seeded)
    assert conn.hello().ok
    conn.send(struct.pack(">IB", 6, 0) + b"\xc1\xff\x00junk")  # a frame, but not msgpack
    err = conn.recv()
    assert (err.id, err.status) == (0, ErrorCode.MALFORMED_FRAME)
    conn.assert_closed_by_server()
    conn.close()
    # Valid msgpack of the wrong shape, undefined flag bits, and another protocol
    # altogether (HTTP, before any HELLO) are malformed too.
    for hello, junk in (
        (True, encode_frame(msgpack.packb([1, 2, 3]))),
        (True, struct.pack(">IB", 3, 0x80) + b"abc"),
        (False, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    ):
        conn = RawConn(seeded)
        if hello:
            assert conn.hello().ok
        conn.send(junk)
        assert conn.recv().status == ErrorCode.MALFORMED_FRAME
        conn.assert_closed_by_server()
        conn.close()
    assert_server_healthy(seeded)


def test_oversized_frame_is_refused_from_its_header(seeded: NameServerProcess) -> None:
    conn = RawConn(seeded)
    assert conn.hello().ok
    # Announce 16 MiB + 1 and send none of it: the answer comes from the header alone.
    conn.send(struct.pack(">IB", 16 * 1024 * 1024 + 1, 0))
    err = conn.recv()
    assert (err.id, err.status) == (0, ErrorCode.FRAME_TOO_LARGE)
    conn.assert_closed_by_server()
    conn.close()
    assert_server_healthy(seeded)


def test_unknown_request_code_keeps_the_connection(seeded: NameServerProcess) -> None:
    conn = RawConn(seeded)
    assert conn.hello().ok
    conn.request(41, 31337, {"x": 1})
    err = conn.recv()
    assert (err.id, err.status) == (41, ErrorCode.UNKNOWN_REQUEST)
    assert "31337" in (err.error or "")
    conn.request(42, RequestCode.GET_ROUTE, {"topic": "orders"})
    ok = conn.recv()
    assert ok.id == 42 and ok.ok
    conn.close()
    assert_server_healthy(seeded)


def test_wrong_version_handshake(seeded: NameServerProcess) -> None:
    conn = RawConn(seeded)
    err = conn.hello(version=2)
    assert (err.id, err.status) == (1, ErrorCode.UNSUPPORTED_VERSION)
    assert "version 2" in (err.error or "") and err.body == {"supported": [1]}
    conn.assert_closed_by_server()
    conn.close()
    conn = RawConn(seeded)
    conn.request(9, RequestCode.GET_ROUTE, {"topic": "orders"})  # no HELLO at all
    err = conn.recv()
    assert (err.id, err.status) == (9, ErrorCode.HANDSHAKE_REQUIRED)
    conn.assert_closed_by_server()
    conn.close()
    assert_server_healthy(seeded)


def test_unknown_topic_and_invalid_bodies_keep_the_connection(seeded: NameServerProcess) -> None:
    async def t(c: RpcClient) -> None:
        with pytest.raises(UnknownTopicError, match="no-such-topic") as info:
            await c.request(RequestCode.GET_ROUTE, {"topic": "no-such-topic"})
        assert info.value.code == ErrorCode.UNKNOWN_TOPIC
        with pytest.raises(InvalidRequestError):
            await c.request(RequestCode.GET_ROUTE, "orders")
        with pytest.raises(InvalidRequestError, match="term"):
            await c.request(
                RequestCode.REGISTER_BROKER, {**registration("n0", "leader", 9), "term": "nine"}
            )
        assert leader_of(await c.request(RequestCode.GET_ROUTE, {"topic": "orders"})) == "n0"

    with_client(seeded, t)
    assert_server_healthy(seeded)


def test_bad_listen_address_and_busy_port_fail_with_a_message(
    seeded: NameServerProcess,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for listen, expect in (("bogus", "HOST:PORT"), (seeded.address, "cannot listen")):
        done = subprocess.run(
            [*ledgermq_command(), "namesrv", "--listen", listen],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode != 0
        assert expect in done.stdout + done.stderr
    assert_server_healthy(seeded)
