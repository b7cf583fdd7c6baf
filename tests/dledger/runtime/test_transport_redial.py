"""A link waiting out its re-dial back-off dials at once when the peer dials
us (its accepted connection says it is up), over real sockets on 127.0.0.1.

Before, a peer restarted after a few seconds down was reached only when the
back-off (up to 0.5 s) ran out; in the failover benchmark the next
election's pre-votes to the restarted node were dropped meanwhile, and a
candidate that would have won waited a round (0.4-0.6 s failovers)."""

from __future__ import annotations

import asyncio

import pytest
from node_harness import wait_until

from dledger.messages import Heartbeat, Message
from dledger.runtime import transport
from dledger.runtime.transport import PeerTransport
from ledgermq.base.loop import run
from ledgermq.base.ports import free_ports

pytestmark = pytest.mark.timeout(60)

# Long enough that only a wake can explain a connection within the wait below.
BACKOFF_S = 60.0


def test_a_link_in_back_off_dials_when_the_peer_dials_us(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "BACKOFF_MIN_S", BACKOFF_S)
    monkeypatch.setattr(transport, "BACKOFF_MAX_S", BACKOFF_S)
    ports = free_ports(2)
    peers = {n: ("127.0.0.1", ports[n - 1]) for n in (1, 2)}

    async def main() -> None:
        heard: list[Message] = []
        one = PeerTransport("g1", 1, peers, lambda _msgs: None, handshake_timeout=2.0)
        two = PeerTransport("g1", 2, peers, heard.extend, handshake_timeout=2.0)
        await one.start()
        try:
            # Node 2 is down: node 1's first dials are refused, then it waits.
            await asyncio.sleep(0.5)
            links = one.stats()["links"]
            assert [links[f"2/{ch}"]["connects"] for ch in ("control", "replication")] == [0, 0]
            await two.start()  # node 2 comes up and dials node 1 at once
            await wait_until(lambda: all(link["connected"]
                                         for link in one.stats()["links"].values()),
                             10.0, "node 1's links to node 2 connected, woken by its dial")
            one.send([Heartbeat(1, 2, 7, 0)])
            await wait_until(lambda: any(m.term == 7 for m in heard), 10.0,
                             "node 2 hears node 1")
        finally:
            await one.close()  # at once, also with links in a 60 s back-off
            await two.close()

    run(main())


def test_a_link_cancelled_while_it_closes_its_socket_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancellation that lands in the link's wait for its closed socket
    (the peer ended the connection) ends the link's task. It used to be
    swallowed there: the task went on to its back-off and dialled again,
    and only `closing` or `removed` could stop it."""
    ports = free_ports(2)
    peers = {n: ("127.0.0.1", ports[n - 1]) for n in (1, 2)}

    async def main() -> None:
        one = PeerTransport("g1", 1, peers, lambda _msgs: None, handshake_timeout=2.0)
        two = PeerTransport("g1", 2, peers, lambda _msgs: None, handshake_timeout=2.0)
        await one.start()
        await two.start()
        try:
            link = one._links[(2, transport.CHANNEL_REPLICATION)]
            await wait_until(lambda: link.writer is not None, 10.0, "the link connected")
            task = link.task
            assert task is not None
            closing = asyncio.Event()
            links_writer, original = link.writer, asyncio.StreamWriter.wait_closed

            async def wait_closed(self: asyncio.StreamWriter) -> None:
                if self is not links_writer:
                    return await original(self)
                closing.set()
                await asyncio.Event().wait()  # the link's close takes its time

            monkeypatch.setattr(asyncio.StreamWriter, "wait_closed", wait_closed)
            await two.close()  # the peer ends the connection: the link's read returns
            async with asyncio.timeout(5.0):
                await closing.wait()
            assert link.writer is None and not task.done()  # waiting for the close
            task.cancel()  # lands in that wait
            await asyncio.wait([task], timeout=5.0)
            assert task.cancelled()
        finally:
            await one.close()
            await two.close()

    run(main())
