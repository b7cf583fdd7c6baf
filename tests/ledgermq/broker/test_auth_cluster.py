"""Authentication and TLS on a real 3-node cluster and its NameServer (all
child processes, started by LocalCluster and stopped by PID): the SDK round
trip with the bootstrap admin's credentials over TLS, unauthenticated and
wrongly authenticated clients refused, and the forged registrations of issue
15 refused by the NameServer while the stock Producer keeps its acks from the
real cluster."""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgermq.base import loop
from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    ConnectionClosedError,
    NoPermissionError,
    UnauthenticatedError,
)
from ledgermq.broker.launcher import LocalCluster, node_status, wait_leader
from ledgermq.client import Credentials, Producer, PullConsumer, PushConsumer
from ledgermq.client.model import MessageQueue, ReceivedMessage
from ledgermq.wire import RpcClient
from ledgermq.wire.auth import CLUSTER_KEY, read_secret_file, write_secret_file
from ledgermq.wire.tls import client_context

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


class Secured:
    def __init__(self, cluster: LocalCluster, admin: Credentials, tls: ssl.SSLContext) -> None:
        self.cluster, self.admin, self.tls = cluster, admin, tls

    @property
    def namesrv(self) -> str:
        return self.cluster.namesrv_address


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    import trustme

    base = tmp_path_factory.mktemp("secured")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(base / "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(str(base / "node.pem"))
    cert.private_key_pem.write_to_path(str(base / "node.key"))
    write_secret_file(base / "cluster.secret")
    admin_secret = write_secret_file(base / "admin.secret")
    settings: dict[str, Any] = {
        "cluster_secret_file": str(base / "cluster.secret"),
        "admin_secret_file": str(base / "admin.secret"),
        "tls_cert_file": str(base / "node.pem"), "tls_key_file": str(base / "node.key"),
        "tls_ca_file": str(base / "ca.pem"),
    }
    with LocalCluster(base / "cluster", nodes=3, settings=settings,
                      admin_listen="127.0.0.1:0") as cluster:
        loop.run(wait_leader(cluster))
        yield Secured(cluster, Credentials("admin", admin_secret),
                      client_context(str(base / "ca.pem")))


async def _connect(address: str, **kw: Any) -> RpcClient:
    host, port = split_host_port(address)
    return await RpcClient.connect(host, port, timeout=3.0, **kw)


def test_producer_and_consumer_round_trip_with_the_bootstrap_admin_over_tls(
        secured: Secured) -> None:
    async def main() -> None:
        async with Producer([secured.namesrv], credentials=secured.admin,
                            tls=secured.tls) as producer:
            await producer.create_topic("secure", queues=2)
            sent = {f"m{i}".encode() for i in range(20)}
            for body in sorted(sent):
                await producer.send("secure", body)
        got: set[bytes] = set()
        done = asyncio.Event()

        async def on_message(message: ReceivedMessage) -> None:
            got.add(message.body)
            if got >= sent:
                done.set()

        consumer = PushConsumer([secured.namesrv], "secure-cg", "secure", on_message,
                                credentials=secured.admin, tls=secured.tls)
        await consumer.start()
        try:
            async with asyncio.timeout(30):
                await done.wait()
        finally:
            await consumer.stop()
        assert got == sent

    loop.run(main())


@pytest.mark.parametrize("code, body", [
    (RequestCode.SEND_MESSAGES, {"messages": [{"topic": "victim", "body": b"x"}]}),
    (RequestCode.PULL_MESSAGES, {"topic": "victim", "queue_id": 0, "offset": 0}),
    (RequestCode.DELETE_TOPIC, {"topic": "victim"}),
    (RequestCode.COMMIT_OFFSETS, {"group": "victim-cg", "offsets": [["victim", 0, 1]]}),
])
def test_an_unauthenticated_client_is_refused_and_changes_nothing(
        secured: Secured, code: int, body: Any) -> None:
    async def main() -> None:
        leader = await wait_leader(secured.cluster)
        address = secured.cluster.client_address(leader)
        async with Producer([secured.namesrv], credentials=secured.admin,
                            tls=secured.tls) as producer:
            await producer.create_topic("victim", queues=1)
            await producer.send("victim", b"v", queue=MessageQueue("victim", "broker-a", 0))
        conn = await _connect(address, ssl=secured.tls)  # TLS, but no credentials
        try:
            with pytest.raises(UnauthenticatedError, match="requires authentication"):
                await conn.request(code, body)
            await asyncio.sleep(0.2)
            with pytest.raises(ConnectionClosedError):  # the broker closed it
                await conn.request(RequestCode.PING, None)
        finally:
            await conn.close()
        # The topic and the group's offset are as they were.
        puller = PullConsumer([secured.namesrv], "victim-cg", credentials=secured.admin,
                              tls=secured.tls)
        try:
            mq = MessageQueue("victim", "broker-a", 0)
            assert await puller.committed(mq) in (-1, 0)
            assert (await puller.pull(mq, 0)).messages
        finally:
            await puller.close()
        status = await node_status(address, credentials=secured.admin, tls=secured.tls)
        assert status is not None and status["role"] == "leader"  # still up

    loop.run(main())


def test_wrong_secrets_are_refused_by_brokers_and_the_namesrv(secured: Secured) -> None:
    async def main() -> None:
        leader = await wait_leader(secured.cluster)
        wrong_admin = Credentials("admin", b"w" * 32)
        with pytest.raises(UnauthenticatedError, match="wrong secret"):
            await _connect(secured.cluster.client_address(leader), ssl=secured.tls,
                           credentials=wrong_admin)
        with pytest.raises(UnauthenticatedError, match="wrong secret"):
            await _connect(secured.namesrv, ssl=secured.tls,
                           credentials=Credentials(CLUSTER_KEY, b"w" * 32))
        # A producer with a wrong secret gets no ack.
        async with Producer([secured.namesrv], credentials=wrong_admin, tls=secured.tls,
                            retry_timeout=2.0) as producer:
            with pytest.raises(UnauthenticatedError):
                await producer.send("secure", b"never")
        # Plain TCP to a TLS port: no HELLO answer.
        with pytest.raises((ConnectionClosedError, ConnectionError, OSError)):
            await _connect(secured.cluster.client_address(leader), credentials=secured.admin)

    loop.run(main())


def test_forged_registrations_are_refused_and_acks_come_from_the_real_cluster(
        secured: Secured) -> None:
    async def main() -> None:
        async with Producer([secured.namesrv], credentials=secured.admin,
                            tls=secured.tls) as producer:
            await producer.create_topic("orders", queues=2)
            await asyncio.sleep(1.5)  # a registration round: the route has the topic
            ns = await _connect(secured.namesrv, role="broker", ssl=secured.tls)
            try:
                before = await ns.request(RequestCode.GET_ROUTE, {"topic": "orders"})
                leader = before["groups"][0]["leader"]
                forged = {"cluster": "DefaultCluster", "group": "broker-a", "node_id": "n9",
                          "address": "127.0.0.1:1", "role": "leader", "term": 10**12,
                          "topics": {"orders": {"queues": 8, "perm": 6}}}
                with pytest.raises(NoPermissionError, match="cluster secret"):
                    await ns.request(RequestCode.REGISTER_BROKER, forged)
                with pytest.raises(NoPermissionError):
                    await ns.request(RequestCode.UNREGISTER_BROKER,
                                     {"group": "broker-a", "node_id": leader["node_id"]})
                with pytest.raises(NoPermissionError):
                    await ns.request(RequestCode.BROKER_HEARTBEAT,
                                     {"group": "broker-a", "node_id": "n9"})
                after = await ns.request(RequestCode.GET_ROUTE, {"topic": "orders"})
            finally:
                await ns.close()
            assert after["groups"][0]["leader"] == leader
            assert {n["node_id"] for n in after["groups"][0]["nodes"]} == {"n1", "n2", "n3"}
            result = await producer.send("orders", b"real", queue=MessageQueue(
                "orders", "broker-a", 0))
        assert result.msg_id is not None and result.msg_id.startswith("broker-a@")
        puller = PullConsumer([secured.namesrv], "orders-cg", credentials=secured.admin,
                              tls=secured.tls)
        try:
            pulled = await puller.pull(MessageQueue("orders", "broker-a", 0), 0)
        finally:
            await puller.close()
        assert [m.msg_id for m in pulled.messages] == [result.msg_id]
        log = (secured.cluster.base / "logs" / "namesrv.log").read_text()
        assert "refused REGISTER_BROKER" in log and "refused UNREGISTER_BROKER" in log

    loop.run(main())


def test_the_status_helper_authenticates_with_the_cluster_key(secured: Secured) -> None:
    creds = secured.cluster.credentials
    assert creds is not None and creds.access_key == CLUSTER_KEY
    assert creds.secret == read_secret_file(Path(secured.cluster.settings["cluster_secret_file"]))

    async def main() -> None:
        leader = await wait_leader(secured.cluster)
        address = secured.cluster.client_address(leader)
        assert await node_status(address, tls=secured.tls) is None  # anonymous: refused
        assert await node_status(address, credentials=creds, tls=secured.tls) is not None

    loop.run(main())


def test_the_namesrv_admin_app_reads_broker_status_with_the_cluster_key(
        secured: Secured) -> None:
    """The NameServer's admin app (HTTPS, signed requests) queries every broker's
    status over the wire, authenticated with the cluster key and over TLS."""
    from ledgermq.client.admin import AdminApi

    assert secured.cluster.namesrv is not None
    url = next(m.group(1) for line in secured.cluster.namesrv.output
               if (m := re.search(r"namesrv admin listening on (https?://\S+)", line)))
    assert url.startswith("https://")

    async def main() -> None:
        async with AdminApi(url, credentials=secured.cluster.credentials,
                            ca_file=str(secured.cluster.settings["tls_ca_file"])) as api:
            view = await api.call("GET", "cluster")
        nodes = view["groups"]["broker-a"]["nodes"]
        assert len(nodes) == 3 and all(n["reachable"] for n in nodes), nodes

    loop.run(main())


def test_a_brokers_cluster_view_reads_its_peers_with_the_cluster_key(secured: Secured) -> None:
    """A broker's own `/api/v1/cluster` asks its peers for their status over the
    wire, authenticated with the cluster key and over TLS, as the NameServer does:
    an open request would be refused, and every peer would show as unreachable."""
    from ledgermq.broker.launcher import wait_admin_url
    from ledgermq.client.admin import AdminApi

    async def main() -> None:
        url = await wait_admin_url(secured.cluster, 1)
        async with AdminApi(url, credentials=secured.cluster.credentials,
                            ca_file=str(secured.cluster.settings["tls_ca_file"])) as api:
            view = await api.call("GET", "cluster")
        nodes = view["groups"]["broker-a"]["nodes"]
        assert len(nodes) == 3 and all(n["reachable"] for n in nodes), nodes
        assert {n["role"] for n in nodes} == {"leader", "follower"}

    loop.run(main())
