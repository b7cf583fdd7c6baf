"""Busy polling (ledgermq/wire/busy_poll.py) over real sockets on 127.0.0.1:
a spin keeps the loop polling until a watched connection is readable or its
window passes, lets timers and callbacks run meanwhile, and the servers
start one after they answer (RpcServer) or send entries (PeerTransport)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from node_harness import wait_until

from dledger.messages import AppendRequest, AppendResponse, Entry, Heartbeat, Message
from dledger.runtime.transport import PeerTransport
from ledgermq.base.codes import RequestCode
from ledgermq.base.loop import run
from ledgermq.base.ports import free_ports
from ledgermq.wire import busy_poll
from ledgermq.wire.busy_poll import BusyPoll
from ledgermq.wire.rpc import RpcServer
from ledgermq.wire.rpc_client import RpcClient

pytestmark = pytest.mark.timeout(60)


class Owner:
    """What watches a socket (a protocol, in the servers); held weakly."""


@contextlib.asynccontextmanager
async def _pair() -> AsyncIterator[tuple[BusyPoll, asyncio.Transport, asyncio.Transport]]:
    """A poller of the running loop and (server side, client side) of one
    TCP connection on loopback; all closed on the way out."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.Transport] = loop.create_future()

    class Side(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            if not accepted.done():
                accepted.set_result(transport)  # type: ignore[arg-type]

    server = await loop.create_server(Side, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    served = await accepted
    poller = BusyPoll(loop)
    try:
        yield poller, served, client
    finally:
        client.close()
        served.close()
        server.close()
        poller.close()


def test_a_spin_ends_when_a_watched_connection_becomes_readable() -> None:
    """A window of 30 s: only the input can end it, written by a timer that
    runs while the loop spins."""
    async def main() -> None:
        async with _pair() as (poller, served, client):
            assert poller.watch(Owner(), served) is not None
            assert poller.watched == 1
            asyncio.get_running_loop().call_later(0.05, client.write, b"x")
            poller.expect(30.0)
            assert poller.spins == 1
            await wait_until(lambda: poller.ended_by_input == 1, 10.0, "the spin ended by input")
            assert poller.spins == 1

    run(main())


def test_a_spin_without_input_ends_at_its_window() -> None:
    async def main() -> None:
        async with _pair() as (poller, served, _client):
            poller.watch(Owner(), served)
            ticks = 0

            def count() -> None:  # other callbacks run between the ticks
                nonlocal ticks
                ticks += 1

            poller.expect(0.02)
            poller.expect(0.01)  # a shorter window does not cut the spin
            assert poller.spins == 1
            for _ in range(5):
                asyncio.get_running_loop().call_soon(count)
                await asyncio.sleep(0)
            await asyncio.sleep(0.1)
            assert ticks == 5
            assert poller.ended_by_input == 0 and not poller._spinning
            # Nothing watched: nothing to spin for.
            empty = BusyPoll(asyncio.get_running_loop())
            empty.expect(1.0)
            assert empty.spins == 0
            empty.close()

    run(main())


def test_unwatch_leaves_a_reused_descriptor_to_its_new_owner() -> None:
    async def main() -> None:
        async with _pair() as (poller, served, _client):
            first, second = Owner(), Owner()
            fd = poller.watch(first, served)
            assert fd is not None
            # The number is taken over (as after a close and a new accept).
            assert poller.watch(second, served) == fd
            poller.unwatch(first, fd)
            assert poller.watched == 1
            poller.unwatch(second, fd)
            assert poller.watched == 0
            # A socket closed before it is unwatched: no error.
            fd = poller.watch(first, served)
            served.close()
            await asyncio.sleep(0.05)
            assert fd is not None
            poller.unwatch(first, fd)
            assert poller.watched == 0
            # A transport without a socket is not watched.
            assert poller.watch(first, asyncio.BaseTransport()) is None

    run(main())


def test_an_rpc_server_spins_after_its_answers_and_watches_its_connections() -> None:
    async def main() -> None:
        server = RpcServer("test", {}, busy_poll_s=0.001)
        host, port = await server.start("127.0.0.1", 0)
        poller = busy_poll.shared()
        assert poller.watched == 0
        client = await RpcClient.connect(host, port)
        try:
            await wait_until(lambda: poller.watched == 1, 10.0, "the connection watched")
            before = poller.expects
            await client.request(RequestCode.PING, {})
            assert poller.expects == before + 1  # the answer's write
            assert poller.spins >= 1
        finally:
            await client.close()
            await server.close(grace=1.0)
        await wait_until(lambda: poller.watched == 0, 10.0, "the closed connection unwatched")

    run(main())


def test_an_rpc_server_without_busy_poll_watches_nothing() -> None:
    async def main() -> None:
        server = RpcServer("test", {})
        host, port = await server.start("127.0.0.1", 0)
        client = await RpcClient.connect(host, port)
        try:
            await client.request(RequestCode.PING, {})
            poller = busy_poll.shared()
            assert (poller.watched, poller.expects, poller.spins) == (0, 0, 0)
        finally:
            await client.close()
            await server.close(grace=1.0)

    run(main())


def test_a_peer_transport_spins_after_sending_entries_only() -> None:
    """Entries expect acknowledgements: a spin. A heartbeat, an
    acknowledgement or an append without entries expects nothing soon."""
    ports = free_ports(2)
    peers = {n: ("127.0.0.1", ports[n - 1]) for n in (1, 2)}

    async def main() -> None:
        heard: list[Message] = []
        one = PeerTransport("g1", 1, peers, lambda _msgs: None, handshake_timeout=2.0,
                            busy_poll_s=0.001)
        two = PeerTransport("g1", 2, peers, heard.extend, handshake_timeout=2.0,
                            busy_poll_s=0.001)
        await one.start()
        await two.start()
        poller = busy_poll.shared()
        try:
            await wait_until(lambda: all(link["connected"] for t in (one, two)
                                         for link in t.stats()["links"].values()),
                             10.0, "the links connected")
            # Each node watches its inbound connections from the other.
            assert poller.watched >= 2
            before = poller.expects
            one.send([Heartbeat(1, 2, 1, 0), AppendResponse(1, 2, 1, True, 0, 0, 0),
                      AppendRequest(1, 2, 1, 0, 0, (), 0)])
            await wait_until(lambda: len(heard) == 3, 10.0, "node 2 heard them")
            await asyncio.sleep(0.01)
            assert poller.expects == before
            one.send([AppendRequest(1, 2, 1, 0, 0, (Entry(1, 1, 1, b"x", 0),), 0)])
            await wait_until(lambda: len(heard) == 4, 10.0, "node 2 heard the entry")
            assert poller.expects == before + 1
        finally:
            await one.close()
            await two.close()

    run(main())


def test_the_shared_poller_is_one_per_loop() -> None:
    async def main() -> BusyPoll:
        assert busy_poll.shared() is busy_poll.shared(asyncio.get_running_loop())
        return busy_poll.shared()

    first, second = run(main()), run(main())
    assert first is not second
