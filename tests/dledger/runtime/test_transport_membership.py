"""The peer transport follows the group's membership, over real sockets on
127.0.0.1: peers added at runtime are dialled and heard, removed ones are cut
off (connections closed, no re-dial, messages to them dropped), unknown nodes
are refused and counted unless the node admits them (then they are answered
at the address their HELLO advertises), a peer of another protocol version is
refused by name; with a cluster secret and TLS alike."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trustme
from node_harness import wait_until

from dledger.messages import Heartbeat, HeartbeatResponse, Message, VoteRequest
from dledger.runtime.codec import HELLO_MAGIC
from dledger.runtime.transport import PeerTransport, tls_contexts
from ledgermq.base.loop import run
from ledgermq.base.ports import free_ports
from ledgermq.wire.codec import encode_frame

pytestmark = pytest.mark.timeout(60)

HOST = "127.0.0.1"
SECRET = b"0123456789abcdef-the-cluster-secret"


class Node:
    """One transport and what it delivered."""

    def __init__(self, node_id: int, port: int, peers: dict[int, tuple[str, int]] | None = None,
                 **kwargs: Any) -> None:
        self.id = node_id
        self.address = (HOST, port)
        self.received: list[Message] = []
        self.transport = PeerTransport("g1", node_id, {**(peers or {}), node_id: self.address},
                                       self.received.extend, handshake_timeout=2.0, **kwargs)

    def from_(self, src: int) -> list[Message]:
        return [m for m in self.received if m.src == src]

    def refusals(self, reason: str) -> int:
        return self.transport.auth_failures.get(reason, 0)


def nodes(count: int, **kwargs: Any) -> list[Node]:
    return [Node(i + 1, port, **kwargs) for i, port in enumerate(free_ports(count))]


async def started(*group: Node) -> None:
    for n in group:
        await n.transport.start()


async def closed(*group: Node) -> None:
    for n in group:
        await n.transport.close()


async def exchange(a: Node, b: Node, term: int) -> None:
    """a -> b and b -> a, each seen by the other (re-sent while links come up)."""
    async def arrived(dst: Node, src: Node, send: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while not any(m.term == term for m in dst.from_(src.id)):
            assert loop.time() < deadline, f"node {src.id} -> {dst.id} (term {term}) not seen"
            send()
            await asyncio.sleep(0.02)

    await arrived(b, a, lambda: a.transport.send([Heartbeat(a.id, b.id, term, 0)]))
    await arrived(a, b, lambda: b.transport.send([HeartbeatResponse(b.id, a.id, term)]))


def test_a_peer_added_at_runtime_is_dialled_and_heard() -> None:
    async def main() -> None:
        a, b = nodes(2)
        await started(a, b)
        try:
            assert a.transport.stats()["peers"] == [] and not a.transport.connected(2)
            a.transport.add_peer(2, b.address)
            # b does not list a yet: a's connections are refused and counted.
            await wait_until(lambda: b.refusals("unknown_peer") >= 2, 5.0, "b refusing a")
            a.transport.send([Heartbeat(1, 2, 1, 0)])
            assert b.received == []
            b.transport.set_peers({1: a.address, 2: b.address})
            await exchange(a, b, 2)
            await wait_until(lambda: a.transport.connected(2) and b.transport.connected(1),
                             5.0, "links up both ways")
            assert a.transport.stats()["peers"] == [2] and b.transport.stats()["peers"] == [1]
            assert b.transport.inbound(1) == 2 and a.transport.inbound(2) == 2
        finally:
            await closed(a, b)

    run(main())


def test_set_peers_is_idempotent_and_follows_a_moved_peer() -> None:
    async def main() -> None:
        a, b = nodes(2)
        a.transport.set_peers({2: b.address})
        b.transport.set_peers({1: a.address})
        await started(a, b)
        try:
            await exchange(a, b, 1)
            links = dict(a.transport._links)
            connects = a.transport.stats()["links"]["2/control"]["connects"]
            for _ in range(3):
                a.transport.set_peers({1: a.address, 2: b.address})
            assert a.transport._links == links
            await exchange(a, b, 2)
            assert a.transport.stats()["links"]["2/control"]["connects"] == connects
            # Node 2 comes back at another port: a follows it there.
            await b.transport.close()
            (port,) = free_ports(1)
            moved = Node(2, port, {1: a.address})
            await moved.transport.start()
            try:
                a.transport.set_peers({2: moved.address})
                await exchange(a, moved, 3)
                assert a.transport.stats()["links"]["2/control"]["connects"] == 1
            finally:
                await closed(moved)
        finally:
            await closed(a, b)

    run(main())


def test_a_removed_peer_is_cut_off_and_never_redialled() -> None:
    async def main() -> None:
        a, b, c = nodes(3)
        for n in (a, b, c):
            n.transport.set_peers({m.id: m.address for m in (a, b, c)})
        await started(a, b, c)
        try:
            await exchange(a, b, 1)
            await exchange(a, c, 1)
            accepted = b.transport.accepted_connections
            a.transport.remove_peer(2)
            assert not a.transport.connected(2) and a.transport.inbound(2) == 0
            assert a.transport.stats()["peers"] == [3]
            # b sees a's connections end, and a never dials it again.
            await wait_until(lambda: b.transport.inbound(1) == 0, 5.0, "b losing a's links")
            # b still lists a and re-dials it: refused as unknown, counted.
            await wait_until(lambda: a.refusals("unknown_peer") >= 2, 5.0, "a refusing b")
            heard = len(a.from_(2))
            b.transport.send([HeartbeatResponse(2, 1, 9)])
            a.transport.send([Heartbeat(1, 2, 9, 0), VoteRequest(1, 2, 9, 0, 0)])
            await asyncio.sleep(1.5)  # three times the longest re-dial backoff
            assert b.transport.accepted_connections == accepted
            assert b.transport.inbound(1) == 0 and not a.transport.connected(2)
            assert len(a.from_(2)) == heard and not [m for m in b.from_(1) if m.term == 9]
            assert a.transport.stats()["unroutable"] == 2
            assert "2/control" not in a.transport.stats()["links"]
            # The rest of the group is not disturbed.
            await exchange(a, c, 2)
            # Listed again, it is dialled again.
            a.transport.add_peer(2, b.address)
            await exchange(a, b, 3)
        finally:
            await closed(a, b, c)

    run(main())


def test_an_unknown_node_is_refused_unless_admitted_then_answered() -> None:
    async def main() -> None:
        a, b = nodes(2)
        admitted: set[int] = set()
        a.transport.accept_peer = admitted.__contains__
        b.transport.set_peers({1: a.address})  # a does not list b
        await started(a, b)
        try:
            await wait_until(lambda: a.refusals("unknown_peer") >= 2, 5.0, "a refusing b")
            assert a.transport.rejected_connections >= 2 and a.received == []
            assert a.transport.stats()["learned"] == []
            # The node admits b (say, a member its configuration does not list
            # yet): b's links are accepted and a answers at b's advertised address.
            admitted.add(2)
            await exchange(b, a, 1)
            assert a.transport.learned == {2: b.address}
            assert a.transport.stats()["peers"] == [] and a.transport.connected(2)
            # Listing it turns it into a peer; unlisting it (no longer
            # admitted) drops it.
            a.transport.set_peers({2: b.address})
            assert a.transport.learned == {} and a.transport.stats()["peers"] == [2]
            admitted.clear()
            a.transport.set_peers({})
            assert not a.transport.connected(2)
            await wait_until(lambda: a.refusals("unknown_peer") >= 4, 5.0, "b refused again")
            # A learned peer that is no longer admitted goes at the next set_peers.
            admitted.add(2)
            await wait_until(lambda: a.transport.learned, 5.0, "b learned again")
            admitted.clear()
            a.transport.set_peers({})
            assert a.transport.learned == {} and a.transport.inbound(2) == 0
        finally:
            await closed(a, b)

    run(main())


def test_every_message_leaves_under_the_nodes_directory_id() -> None:
    async def main() -> None:
        port_a, port_b = free_ports(2)
        b = Node(2, port_b)
        a = Node(1, port_a, {2: b.address}, directory_id=0x5EED)
        b.transport.set_peers({1: a.address})
        await started(a, b)
        try:
            a.transport.send([Heartbeat(1, 2, 1, 0, directory_id=7)])
            await exchange(a, b, 2)
            assert {m.directory_id for m in b.from_(1)} == {0x5EED}
            assert {m.directory_id for m in a.from_(2)} == {0}  # b has none set
        finally:
            await closed(a, b)

    run(main())


@pytest.mark.parametrize("version", [1, 3, "2"])
def test_a_peer_of_another_protocol_version_is_refused_by_name(
        version: object, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        (a,) = nodes(1)
        a.transport.set_peers({2: (HOST, free_ports(1)[0])})
        await started(a)
        try:
            reader, writer = await asyncio.open_connection(*a.address)
            writer.write(encode_frame(msgpack.packb(
                {"hello": HELLO_MAGIC, "version": version, "group": "g1", "src": 2, "dst": 1,
                 "channel": "control"}), compress_threshold=None))
            async with asyncio.timeout(5.0):
                assert await reader.read(1) == b""
            writer.close()
            assert a.refusals("version_mismatch") == 1
        finally:
            await closed(a)

    with caplog.at_level(logging.WARNING, logger="dledger.runtime.transport"):
        run(main())
    assert f"node 2 speaks Raft peer protocol version {version!r}, this node speaks 2" in \
        caplog.text
    assert "version_mismatch" in caplog.text


# -------------------------------------------------------- secret and TLS


def tls_for(root: Path, ca: trustme.CA, name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    root.mkdir(parents=True, exist_ok=True)
    pem, ca_file = root / f"{name}.pem", root / "ca.pem"
    ca.issue_cert(HOST).private_key_and_cert_chain_pem.write_to_path(str(pem))
    ca.cert_pem.write_to_path(str(ca_file))
    return tls_contexts(str(pem), str(pem), str(ca_file))


@pytest.mark.parametrize("tls", [False, True], ids=["secret", "secret+tls"])
def test_membership_changes_keep_authentication_and_tls(tmp_path: Path, tls: bool) -> None:
    async def main() -> None:
        ca = trustme.CA()
        group: list[Node] = []
        for i, port in enumerate(free_ports(3)):
            kwargs: dict[str, Any] = {"secret": SECRET}
            if tls:
                server, client = tls_for(tmp_path, ca, f"n{i + 1}")
                kwargs.update(server_ssl=server, client_ssl=client)
            group.append(Node(i + 1, port, **kwargs))
        a, b, c = group
        admitted: set[int] = set()
        a.transport.accept_peer = admitted.__contains__
        a.transport.set_peers({2: b.address})
        b.transport.set_peers({1: a.address})
        c.transport.set_peers({1: a.address})
        # A stranger with the node id of a future member but another secret.
        stranger = Node(3, free_ports(1)[0], {1: a.address},
                        secret=b"another-secret-entirely-0123456789",
                        **({"server_ssl": group[2].transport.server_ssl,
                            "client_ssl": group[2].transport.client_ssl} if tls else {}))
        await started(a, b, c, stranger)
        try:
            await exchange(a, b, 1)
            await wait_until(lambda: a.refusals("unknown_peer") >= 2, 5.0, "a refusing 3")
            admitted.add(3)
            # Admitted, the real node 3 gets in; the stranger still proves nothing.
            await exchange(c, a, 2)
            await wait_until(lambda: a.refusals("bad_proof") >= 1, 5.0, "stranger refused")
            assert a.transport.learned == {3: c.address}
            assert all(m.src != 3 or m.term == 2 for m in a.received)
            a.transport.add_peer(3, c.address)
            assert a.transport.learned == {} and a.transport.stats()["peers"] == [2, 3]
            await exchange(a, c, 3)
            admitted.clear()
            a.transport.remove_peer(3)
            await wait_until(lambda: c.transport.inbound(1) == 0 and a.transport.inbound(3) == 0,
                             5.0, "node 3 cut off")
            await exchange(a, b, 4)
            stats = a.transport.stats()
            assert stats["authenticated"] and stats["tls"] == tls
        finally:
            await closed(a, b, c, stranger)

    run(main())
