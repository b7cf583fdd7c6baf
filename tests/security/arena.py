"""The secured cluster the attack suite plays against (tests/security/test_attacks.py).

`Arena` is one 3-node broker group and its NameServer, started by
`tests.ops.support.SecureOpsCluster` (LocalCluster: every process a child
stopped by PID) with everything on: a cluster secret, the bootstrap
administrator, TLS from a throwaway trustme CA on the client ports, the Raft
ports (mutual) and the admin apps; plus tighter resource bounds so the floods
stay small. It holds what the attacks need (the leader, its term and PID, ACL
users, an attacker's certificate from the same CA) and checks that the
cluster still serves after each one.

`Workload` is the honest traffic: a Producer and a PushConsumer of an ACL
user, in their own thread and event loop, sending one message every 20 ms for
as long as the module runs and recording every acknowledgement, so the suite
can show at the end that nothing acknowledged was lost.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledgermq.base import loop
from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.broker.launcher import node_status, wait_leader
from ledgermq.client import Credentials, Producer, PushConsumer
from ledgermq.client.model import ReceivedMessage
from ledgermq.wire import RpcClient
from ledgermq.wire.auth import write_secret_file
from ledgermq.wire.tls import client_context
from tests.ops.support import SecureOpsCluster, until
from tests.security.memory import RssWatch

GROUP = "broker-a"
TOPIC = "ledger"
CONSUMER_GROUP = "ledger-cg"


class AttackCluster(SecureOpsCluster):
    """A SecureOpsCluster with the client port's resource bounds given and
    patient elections."""

    def __init__(self, base_dir: Path, settings: dict[str, Any]) -> None:
        super().__init__(base_dir)
        self.settings.update(settings)
        # Elections after 1.5-3 s of silence rather than LocalCluster's
        # 0.3 s: the suite asserts that the term never moves, so a loaded
        # machine must not cause an election the attacks did not.
        self.raft.update(election_timeout_ticks=75)


@dataclass
class Workload:
    """One message every `interval` s to TOPIC as `credentials`, consumed by a
    PushConsumer in CONSUMER_GROUP; `acked` holds (queue id, queue offset,
    body) of every acknowledged send, in acknowledgement order."""

    namesrv: str
    credentials: Credentials
    ca_file: str
    interval: float = 0.02
    acked: list[tuple[int, int, bytes]] = field(default_factory=list)
    received: set[bytes] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)

    def start(self) -> Workload:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)
        assert not self._thread.is_alive(), "the workload did not stop"
        if self.error is not None:
            raise AssertionError("the workload failed") from self.error

    def _run(self) -> None:
        try:
            loop.run(self._main())
        except BaseException as exc:  # reported by stop()
            self.error = exc

    async def _main(self) -> None:
        tls = client_context(self.ca_file)

        async def on_message(message: ReceivedMessage) -> None:
            self.received.add(message.body)

        async with Producer([self.namesrv], credentials=self.credentials, tls=tls) as producer:
            consumer = PushConsumer([self.namesrv], CONSUMER_GROUP, TOPIC, on_message,
                                    credentials=self.credentials, tls=tls)
            await consumer.start()
            try:
                i = 0
                while not self._stop.is_set():
                    body = b"acked-%06d" % i
                    i += 1
                    try:
                        result = await producer.send(TOPIC, body, timeout=10.0)
                    except Exception as exc:  # not acknowledged: may or may not be stored
                        self.failures.append(f"{body!r}: {exc!r}")
                    else:
                        assert result.queue_offset is not None, result
                        self.acked.append((result.queue.queue_id, result.queue_offset, body))
                    await asyncio.sleep(self.interval)
                # Let the consumer catch up with everything acknowledged.
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and \
                        not {b for _, _, b in self.acked} <= self.received:
                    await asyncio.sleep(0.1)
            finally:
                await consumer.stop()

    async def progressed(self, count: int = 3, timeout: float = 20.0) -> None:
        """Until `count` more sends than now have been acknowledged."""
        target = len(self.acked) + count

        async def done() -> bool:
            assert self.error is None, self.error
            return len(self.acked) >= target

        await until(done, timeout, f"{count} more acknowledged sends")


class Arena:
    """The running secured cluster, as the attack tests see it."""

    def __init__(self, cluster: AttackCluster) -> None:
        self.cluster = cluster
        self.tls = client_context(cluster.ca_file)
        base = Path(cluster.base)
        # An attacker's certificate, signed by the cluster's own CA: the worst
        # case for the Raft port (mutual TLS lets it in; the secret must not).
        self.attacker_pem = str(base / "attacker.pem")
        cluster.ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
            self.attacker_pem)
        self.mallory = Credentials("mallory", write_secret_file(base / "mallory.secret"))
        self.app = Credentials("app", write_secret_file(base / "app.secret"))
        self.leader = 0
        self.term = 0
        self.pid = 0
        self.workload: Workload | None = None
        # The leader's RSS once the workload runs, and the module-long watch.
        self.baseline = 0.0
        self.watch: RssWatch | None = None

    @property
    def work(self) -> Workload:
        assert self.workload is not None, "the workload is not running"
        return self.workload

    # ------------------------------------------------------------ addresses

    @property
    def namesrv(self) -> str:
        return self.cluster.namesrv_address

    def client(self, nid: int) -> tuple[str, int]:
        return split_host_port(self.cluster.client_address(nid))

    def raft_port(self, nid: int) -> int:
        return split_host_port(self.cluster.peers[nid].raft)[1]

    def log(self, nid: int | None = None) -> str:
        name = "namesrv" if nid is None else f"n{nid}"
        return (Path(self.cluster.base) / "logs" / f"{name}.log").read_text()

    # ------------------------------------------------------------ requests

    async def connect(self, address: str | tuple[str, int], credentials: Credentials | None,
                      role: str = "client") -> RpcClient:
        host, port = split_host_port(address) if isinstance(address, str) else address
        return await RpcClient.connect(host, port, role=role, timeout=5.0,
                                       credentials=credentials, ssl=self.tls)

    async def as_admin(self, code: int, body: Any) -> Any:
        """One request to the current leader as the bootstrap administrator."""
        conn = await self.connect(self.client(self.leader), self.cluster.admin)
        try:
            return await conn.request(code, body)
        finally:
            await conn.close()

    async def status(self, nid: int) -> dict[str, Any]:
        status = await node_status(self.cluster.client_address(nid), timeout=5.0,
                                   credentials=self.cluster.cluster_member, tls=self.tls)
        assert status is not None, f"node {nid} does not answer BROKER_STATUS"
        return status

    async def route(self, topic: str = TOPIC) -> dict[str, Any]:
        """The NameServer's route, read as anonymous clients read it."""
        conn = await self.connect(self.namesrv, None)
        try:
            route: dict[str, Any] = await conn.request(RequestCode.GET_ROUTE, {"topic": topic})
            return route
        finally:
            await conn.close()

    # ------------------------------------------------------------ state

    async def settle(self) -> None:
        """The leader, its term and PID, once the group is ready."""
        self.leader = await wait_leader(self.cluster)
        self.term = (await self.status(self.leader))["term"]
        self.pid = self.cluster.brokers[self.leader].proc.pid

    async def still_serving(self) -> None:
        """Every process alive; every broker answers, in the same term under
        the same leader (a forged vote or an overflowed term would show here);
        the NameServer routes to that leader; the workload keeps getting acks."""
        assert sorted(self.cluster.alive()) == [1, 2, 3], self.cluster.alive()
        assert self.cluster.namesrv is not None and self.cluster.namesrv.alive
        for nid in (1, 2, 3):
            status = await self.status(nid)
            assert (status["term"], status["leader_id"]) == (self.term, self.leader), \
                (nid, status["term"], status["leader_id"], self.term, self.leader)
        await self.routes_to_leader()
        await self.work.progressed()

    async def routes_to_leader(self) -> None:
        """The NameServer's route for TOPIC names the real leader and exactly
        the group's three real nodes."""
        real = {(f"n{nid}", self.cluster.client_address(nid)) for nid in (1, 2, 3)}
        seen: list[Any] = []

        async def agrees() -> bool:
            (group,) = (await self.route())["groups"]
            seen[:] = [group]
            nodes = {(n["node_id"], n["address"]) for n in group["nodes"]}
            leader = group["leader"] or {}
            return (leader.get("node_id"), leader.get("address")) == (
                f"n{self.leader}", self.cluster.client_address(self.leader)) and nodes == real

        try:
            await until(agrees, 10.0, "the route to name the real leader and nodes")
        except AssertionError:
            raise AssertionError(f"the route is not the real group's: {seen}") from None


def run(coro: Any) -> Any:
    return loop.run(coro)


__all__ = ["CONSUMER_GROUP", "GROUP", "TOPIC", "Arena", "AttackCluster", "Workload", "run"]
