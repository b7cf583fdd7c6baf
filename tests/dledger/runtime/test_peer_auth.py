"""The Raft port under attack, over real sockets: three `RaftGroupNode`s on one
loop with real transports and CommitLogs, and an attacker that sends
well-encoded forged handshakes and messages (docs/raft.md, "Peer
authentication"; docs/security.md).

The open-group tests show that each forged frame is one a node would act on
(an open group trusts its network by design); the same frames are refused
once the group has a cluster secret.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from dataclasses import replace
from pathlib import Path

import pytest
import trustme
from node_harness import Cluster, log_entries, wait_until

import commitlog
from dledger.messages import AppendRequest
from dledger.runtime.node import RaftGroupNode
from dledger.runtime.transport import PeerTransport, tls_contexts
from ledgermq.base.loop import run
from ledgermq.base.ports import free_ports
from tests.security import raft_forgery
from tests.security.raft_forgery import FORGED, forged_transfer_vote, send_forged

pytestmark = pytest.mark.timeout(120)

SECRET = b"0123456789abcdef-the-cluster-secret"
OTHER_SECRET = b"fedcba9876543210-another-secret"

# ------------------------------------------------------------------ attacker


def forged_append(leader: RaftGroupNode, follower: RaftGroupNode) -> AppendRequest:
    """What the follower would take from its leader: the leader's term, the
    follower's last entry as predecessor, a FORGED entry at the right
    position and a commit index covering it."""
    last = follower.log.last_index
    prev = follower.log.read_entries(last, last + 1)[0]
    end = prev.position + commitlog.HEADER_SIZE + len(prev.body)
    return raft_forgery.forged_append(leader.config.node_id, follower.config.node_id,
                                      leader.term, last, prev.term, end)


def holds_forged(node: RaftGroupNode) -> bool:
    return any(e.body == FORGED for e in node.log.read_entries(1, node.log.last_index + 1))


async def settled(cluster: Cluster, n: int = 5) -> RaftGroupNode:
    """A ready leader whose `n` new entries every replica has applied."""
    leader = await cluster.wait_leader()
    for i in range(n):
        await leader.propose(commitlog.KIND_MESSAGES, b"real-%d" % i)
    await cluster.wait_converged()
    return leader


def port_of(cluster: Cluster, node_id: int) -> int:
    return cluster.peers[node_id][1]


def failures(node: RaftGroupNode, reason: str) -> int:
    return node.counters.auth_failures.get(reason, 0)


# ------------------------------------------------------------------ TLS files


def write_tls(root: Path, ca: trustme.CA, name: str, *identities: str) -> tuple[str, str]:
    """(cert+key file, CA file) for a node certificate naming `identities`."""
    root.mkdir(parents=True, exist_ok=True)
    pem = root / f"{name}.pem"
    ca_file = root / "ca.pem"
    ca.issue_cert(*identities).private_key_and_cert_chain_pem.write_to_path(str(pem))
    ca.cert_pem.write_to_path(str(ca_file))
    return str(pem), str(ca_file)


def contexts(root: Path, ca: trustme.CA, name: str,
             *identities: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    pem, ca_file = write_tls(root, ca, name, *identities)
    return tls_contexts(pem, pem, ca_file)


# ---------------------------------------------------------------- open groups


def test_an_open_group_believes_forged_appends_and_transfer_votes(tmp_path: Path) -> None:
    """The threat: without a secret the port believes anyone (loopback dev
    clusters only). Also proves the forged frames below are well-formed."""
    async def main() -> None:
        cluster = Cluster(tmp_path)
        await cluster.start_all()
        try:
            leader = await settled(cluster)
            follower = next(n for n in cluster.nodes.values() if n is not leader)
            forged = forged_append(leader, follower)
            await send_forged(port_of(cluster, follower.config.node_id), forged, wait=0.3)
            await wait_until(lambda: holds_forged(follower), 5.0, "the forged entry")
            await wait_until(lambda: follower.commit_index >= forged.entries[0].index, 5.0,
                             "the forged entry committed")
            assert not holds_forged(leader)

            term = leader.term
            for node in cluster.nodes.values():
                src = next(p for p in cluster.peers if p != node.config.node_id)
                await send_forged(port_of(cluster, node.config.node_id),
                                  forged_transfer_vote(src, node.config.node_id, term), wait=0.3)
            await wait_until(lambda: any(n.term > term for n in cluster.nodes.values()), 5.0,
                             "a forced election")
        finally:
            await cluster.stop_all()

    run(main())


# ---------------------------------------------------------- groups with a secret


def test_forged_append_entries_are_refused(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, cluster_secret=SECRET)
        await cluster.start_all()
        try:
            leader = await settled(cluster)
            before = {i: (n.log.last_index, n.commit_index) for i, n in cluster.nodes.items()}
            leader_id = leader.config.node_id
            for follower in [n for n in cluster.nodes.values() if n is not leader]:
                fid = follower.config.node_id
                port = port_of(cluster, fid)
                forged = forged_append(leader, follower)
                # No proof at all; a made-up proof; a claim to be the node
                # itself; a claim to be a node that is not in the group (let
                # through the membership check, since a node added by a
                # configuration not received yet must get in, and refused for
                # its missing proof).
                assert await send_forged(port, forged)
                assert await send_forged(port, forged, with_nonce=True)
                assert await send_forged(port, forged, src=fid, with_nonce=True)
                assert await send_forged(port, forged, src=99)
                assert failures(follower, "no_proof") >= 1
                assert failures(follower, "bad_proof") >= 1
                assert failures(follower, "unknown_peer") >= 1
            await asyncio.sleep(0.3)
            after = {i: (n.log.last_index, n.commit_index) for i, n in cluster.nodes.items()}
            assert after == before
            assert not any(holds_forged(n) for n in cluster.nodes.values())
            assert leader.leader_ready and leader.config.node_id == leader_id

            refusals = [r.getMessage() for r in caplog.records
                        if r.levelno == logging.WARNING and "refused peer connection" in
                        r.getMessage()]
            assert len(refusals) >= 8
            assert any("127.0.0.1" in line and f"claims group 'g1' node {leader_id} -> " in line
                       and "no_proof" in line for line in refusals), refusals
            assert any("node 99 ->" in line and "no_proof" in line for line in refusals), \
                refusals

            # The group goes on, every replica identical and clean.
            for i in range(20):
                await leader.propose(commitlog.KIND_MESSAGES, b"after-%d" % i)
            commit = await cluster.wait_converged()
            reference = log_entries(leader, commit)
            for node in cluster.nodes.values():
                assert log_entries(node, commit) == reference
                assert not holds_forged(node)
        finally:
            await cluster.stop_all()

    with caplog.at_level(logging.WARNING, logger="dledger.runtime.transport"):
        run(main())


def test_forged_transfer_votes_force_no_election(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, cluster_secret=SECRET)
        await cluster.start_all()
        try:
            leader = await settled(cluster)
            term = leader.term
            elections = sum(n.counters.elections for n in cluster.nodes.values())
            for node in cluster.nodes.values():
                nid = node.config.node_id
                for src in [p for p in cluster.peers if p != nid]:
                    vote = forged_transfer_vote(src, nid, term)
                    assert await send_forged(port_of(cluster, nid), vote)
                    assert await send_forged(port_of(cluster, nid), vote, with_nonce=True)
            # Longer than an election timeout (0.5-1.0 s): a forced election
            # would have happened by now.
            await asyncio.sleep(1.5)
            assert {n.term for n in cluster.nodes.values()} == {term}
            assert cluster.ready_leader() is leader
            assert sum(n.counters.elections for n in cluster.nodes.values()) == elections
            assert sum(failures(n, "no_proof") + failures(n, "bad_proof")
                       for n in cluster.nodes.values()) == 12
        finally:
            await cluster.stop_all()

    run(main())


def test_a_storm_of_forged_connections_does_not_stop_commits(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, cluster_secret=SECRET)
        await cluster.start_all()
        try:
            leader = await settled(cluster)
            term = leader.term
            leader_id = leader.config.node_id
            ids = sorted(cluster.peers)
            stop = asyncio.Event()
            attacks = 0
            held: list[asyncio.StreamWriter] = []

            async def attacker(seed: int) -> None:
                nonlocal attacks
                rng = random.Random(seed)
                while not stop.is_set():
                    dst = rng.choice(ids)
                    src = rng.choice([p for p in ids if p != dst])
                    port = port_of(cluster, dst)
                    kind = rng.randrange(4)
                    try:
                        if kind == 3:
                            # A silent connection that never finishes its handshake.
                            _, writer = await asyncio.open_connection("127.0.0.1", port)
                            held.append(writer)
                        else:
                            await send_forged(port, forged_transfer_vote(src, dst, term),
                                              with_nonce=kind == 1, src=src, wait=2.0)
                    except ConnectionRefusedError:  # the follower being restarted
                        await asyncio.sleep(0.01)
                        continue
                    attacks += 1

            acked = 0

            async def writer() -> None:
                nonlocal acked
                while not stop.is_set():
                    await leader.propose(commitlog.KIND_MESSAGES, b"storm-%d" % acked)
                    acked += 1

            tasks = [asyncio.create_task(attacker(s)) for s in range(6)]
            tasks.append(asyncio.create_task(writer()))
            await asyncio.sleep(1.0)
            # A follower restarting in the storm gets back in: its handshakes
            # push the attacker's silent connections out of their slots.
            fid = next(i for i in ids if i != leader_id)
            await cluster.stop(fid)
            await asyncio.sleep(0.3)
            await cluster.start(fid, node=RaftGroupNode(cluster.config(fid), lambda e: None))
            await asyncio.sleep(2.0)
            stop.set()
            await asyncio.gather(*tasks)
            for w in held:
                w.close()
            print(f"storm: {attacks} forged connections, {acked} proposals acknowledged")
            assert attacks >= 100
            assert acked >= 100
            assert cluster.ready_leader() is leader and leader.term == term
            await cluster.wait_converged()
            assert not any(holds_forged(n) for n in cluster.nodes.values())
            for node in cluster.nodes.values():
                st = node.status()
                assert st.core is not None
                assert st.core.transport["handshaking_connections"] <= 64
            refused = sum(sum(n.counters.auth_failures.values()) for n in cluster.nodes.values())
            assert refused >= attacks // 2
        finally:
            await cluster.stop_all()

    run(main())


@pytest.mark.parametrize("secret", [OTHER_SECRET, b""], ids=["another-secret", "no-secret"])
def test_a_node_without_the_secret_cannot_join(tmp_path: Path, secret: bytes) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, cluster_secret=SECRET)
        await cluster.start(1)
        await cluster.start(2)
        intruder = RaftGroupNode(replace(cluster.config(3), cluster_secret=secret),
                                 lambda e: None)
        await cluster.start(3, node=intruder)
        try:
            leader = await wait_until(lambda: next(
                (n for n in (cluster.nodes[1], cluster.nodes[2]) if n.leader_ready), None),
                15.0, "a leader among the nodes with the secret")
            for i in range(10):
                await leader.propose(commitlog.KIND_MESSAGES, b"m-%d" % i)
            await asyncio.sleep(1.0)
            assert intruder.log.last_index == 0 and not intruder.leader_ready
            honest = [cluster.nodes[1], cluster.nodes[2]]
            if secret:
                # It dialled in and could not answer the challenge; the honest
                # nodes' own dials to it failed on its proof, and the reverse.
                assert all(failures(n, "bad_proof") >= 1 for n in honest)
                assert all(failures(n, "peer_bad_proof") >= 1 for n in honest)
                assert failures(intruder, "peer_bad_proof") >= 1
            else:
                assert all(failures(n, "no_proof") >= 1 for n in honest)
                assert failures(intruder, "auth_not_expected") >= 1
            # With the right secret it catches up.
            await cluster.stop(3)
            await cluster.start(3)
            await cluster.wait_converged()
            assert cluster.nodes[3].log.last_index >= 11
        finally:
            await cluster.stop_all()

    run(main())


# ---------------------------------------------------------------------- TLS


def test_tls_peers_replicate_and_refuse_what_does_not_verify(tmp_path: Path) -> None:
    ca = trustme.CA()
    server, client = contexts(tmp_path / "tls", ca, "node", "127.0.0.1")

    async def main() -> None:
        cluster = Cluster(tmp_path, cluster_secret=SECRET, tls_server=server,
                          tls_client=client)
        await cluster.start(1)
        await cluster.start(2)
        # Node 3's certificate names "localhost", not the 127.0.0.1 its peers
        # dial: hostname checking refuses it.
        bad_server, bad_client = contexts(tmp_path / "tls", ca, "node3", "localhost")
        await cluster.start(3, node=RaftGroupNode(
            replace(cluster.config(3), tls_server=bad_server, tls_client=bad_client),
            lambda e: None))
        try:
            leader = await wait_until(lambda: next(
                (n for n in (cluster.nodes[1], cluster.nodes[2]) if n.leader_ready), None),
                15.0, "a leader among the nodes with good certificates")
            acked = [await leader.propose(commitlog.KIND_MESSAGES, b"tls-%d" % i)
                     for i in range(50)]
            await asyncio.sleep(0.5)
            assert cluster.nodes[3].log.last_index == 0
            assert all(failures(cluster.nodes[i], "peer_tls") >= 1 for i in (1, 2))
            # Plaintext to a TLS port: refused at the TLS handshake.
            term = leader.term
            for nid in (1, 2):
                src = 2 if nid == 1 else 1
                assert await send_forged(port_of(cluster, nid),
                                         forged_transfer_vote(src, nid, term))
            # A certificate from another CA: the listeners refuse it (mutual
            # TLS) and their dials to it fail verification.
            other_server, other_client = contexts(tmp_path / "other", trustme.CA(), "n3",
                                                  "127.0.0.1")
            await cluster.stop(3)
            before = failures(cluster.nodes[1], "peer_tls")
            intruder = RaftGroupNode(
                replace(cluster.config(3), tls_server=other_server, tls_client=other_client),
                lambda e: None)
            await cluster.start(3, node=intruder)
            await wait_until(lambda: failures(cluster.nodes[1], "peer_tls") > before, 5.0,
                             "a foreign certificate refused")
            await wait_until(lambda: failures(intruder, "peer_tls") >= 1, 5.0,
                             "the foreign node refused by the listeners")
            assert intruder.log.last_index == 0
            assert leader.term == term and leader.leader_ready
            # With a good certificate node 3 catches up, then the group fails over.
            await cluster.stop(3)
            await cluster.start(3)
            commit = await cluster.wait_converged()
            assert commit >= acked[-1].index
            reference = log_entries(leader, commit)
            for node in cluster.nodes.values():
                assert log_entries(node, commit) == reference
                st = node.status()
                assert st.core is not None and st.core.transport["tls"]
            await cluster.stop(leader.config.node_id)
            new_leader = await cluster.wait_leader(timeout=20)
            entry = await new_leader.propose(commitlog.KIND_MESSAGES, b"after-failover")
            assert entry.index > acked[-1].index
        finally:
            await cluster.stop_all()

    run(main())


# ------------------------------------------------------------ bounded resources


def test_handshake_slots_are_capped_and_time_out(tmp_path: Path) -> None:
    """Silent connections: at most `max_pending_per_address` per source
    address and `max_pending` overall wait in their handshake (the oldest
    make room), and none outlives the handshake deadline."""
    async def main() -> None:
        port, unused = free_ports(2)
        transport = PeerTransport("g1", 1, {1: ("127.0.0.1", port), 2: ("127.0.0.1", unused)},
                                  lambda messages: None, secret=SECRET, handshake_timeout=0.5,
                                  max_pending=5, max_pending_per_address=3)
        await transport.start()
        conns = []
        try:
            for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
                for _ in range(4):
                    conns.append(await asyncio.open_connection(
                        "127.0.0.1", port, local_addr=(source, 0)))
            await asyncio.sleep(0.1)
            stats = transport.stats()
            assert stats["handshaking_connections"] <= 5
            # 12 opened, at most 5 kept: the others were closed to make room.
            assert stats["auth_failures"].get("connection_limit", 0) >= 7
            for reader, _ in conns:
                async with asyncio.timeout(3.0):
                    assert await reader.read(1) == b""
            assert transport.stats()["auth_failures"].get("timeout", 0) >= 1
            assert transport.stats()["handshaking_connections"] == 0
        finally:
            for _, writer in conns:
                writer.close()
            await transport.close()

    run(main())
