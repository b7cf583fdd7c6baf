"""Real node processes: SIGKILL the leader under load, elect a new one, restart and catch up;
in an open group, with a cluster secret, and with the secret and TLS on the Raft port."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
import trustme

from dledger.testing.node_processes import ProcessCluster
from ledgermq.base.errors import NotLeaderError
from ledgermq.base.loop import run
from ledgermq.wire.auth import write_secret_file

pytestmark = pytest.mark.timeout(180)


async def wait_converged(cluster: ProcessCluster, timeout: float = 30.0) -> int:
    """All running nodes applied the ready leader's commit index; returns it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        leader = await cluster.ready_leader()
        if leader:
            statuses = {n: await cluster.status(n) for n in cluster.procs}
            commit = statuses[leader]["commit_index"] if statuses[leader] else 0
            if commit and all(s and s["applied_index"] >= commit for s in statuses.values()):
                return int(commit)
        await asyncio.sleep(0.02)
    raise AssertionError("cluster did not converge")


def security_knobs(root: Path, mode: str) -> dict[str, str]:
    """The Raft port's security as node-process config keys."""
    if mode == "open":
        return {}
    secret = root / "cluster.secret"
    write_secret_file(secret)
    knobs = {"cluster_secret_file": str(secret)}
    if mode == "secret+tls":
        ca = trustme.CA()
        pem, ca_file = root / "node.pem", root / "ca.pem"
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
        ca.cert_pem.write_to_path(str(ca_file))
        knobs.update(tls_cert_file=str(pem), tls_key_file=str(pem), tls_ca_file=str(ca_file))
    return knobs


@pytest.mark.parametrize("security", ["open", "secret", "secret+tls"])
def test_sigkill_leader_no_acked_entry_lost(tmp_path: Path, security: str) -> None:
    async def main() -> None:
        cluster = ProcessCluster(tmp_path, flush="sync", replicate="sync",
                                 **security_knobs(tmp_path, security))
        for node_id in cluster.peers:
            cluster.start(node_id)
        state = {"leader": 0}
        acked: set[bytes] = set()
        stop = asyncio.Event()

        async def writer(w: int) -> None:
            i = 0
            while not stop.is_set():
                data = b"w%d-%d" % (w, i)
                i += 1
                target = state["leader"]
                if not target or target not in cluster.procs:
                    await asyncio.sleep(0.01)
                    continue
                try:
                    await cluster.propose(target, data, timeout=1.0)
                except Exception:
                    # Not leader, timed out (outcome unknown) or connection lost.
                    await asyncio.sleep(0.01)
                    continue
                acked.add(data)

        try:
            state["leader"] = await cluster.wait_leader()
            writers = [asyncio.create_task(writer(w)) for w in range(8)]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while len(acked) < 200:
                assert loop.time() < deadline, "writes do not get acknowledged"
                await asyncio.sleep(0.02)

            victim = state["leader"]
            state["leader"] = 0
            await cluster.kill(victim, signal.SIGKILL)
            killed_at = loop.time()
            new_leader = await cluster.wait_leader(timeout=20)
            print(f"kill -> ready leader: {(loop.time() - killed_at) * 1000:.0f} ms")
            assert new_leader != victim
            # The survivors saw the killed process's connections close: the
            # election began on that notice, not after an election timeout.
            notices = [(await cluster.status(n) or {}).get("leader_lost_notices", 0)
                       for n in cluster.procs]
            assert sum(notices) >= 1, notices
            state["leader"] = new_leader
            count = len(acked)
            while len(acked) < count + 100:
                assert loop.time() < deadline + 30, "no writes after failover"
                await asyncio.sleep(0.02)

            # A follower names the leader when asked to write.
            follower = next(n for n in cluster.procs if n != new_leader)
            with pytest.raises(NotLeaderError) as info:
                await cluster.propose(follower, b"x")
            assert info.value.data["leader_id"] == new_leader

            cluster.start(victim)
            more = len(acked)
            while len(acked) < more + 50:
                await asyncio.sleep(0.02)
            stop.set()
            await asyncio.gather(*writers)
            commit = await wait_converged(cluster)

            logs = {n: await cluster.entries(n) for n in cluster.procs}
            reference = logs[new_leader][:commit]
            assert len(reference) == commit
            for node_id, entries in logs.items():
                assert entries[:commit] == reference, node_id
                bodies = {b for _, _, b in entries}
                missing = acked - bodies
                assert not missing, f"node {node_id} lacks {len(missing)} acknowledged entries"
            st = await cluster.status(victim)
            assert st is not None and st["role"] == "follower"
            assert st["transport"]["authenticated"] == (security != "open")
            assert st["transport"]["tls"] == (security == "secret+tls")
            assert st["auth_failures"] == {}
        finally:
            stop.set()
            await cluster.close_clients()
            await cluster.stop_all()

    run(main())
