"""docker/compose.yml end to end: build, deploy, produce, lose the leader, consume.

The 3-node deployment runs exactly as a user would run it (the compose file
unchanged; only its variables: a free /24, a free host port for the published
NameServer, a project name of its own). It starts with authentication on: the
containers share one generated cluster secret, a client without credentials
is refused, and the host's client SDK signs in with the administrator's
secret copied out of a container as docker/compose.yml says. It finds the
brokers through the NameServer's published port, sends acknowledged
messages, the leader's container is stopped, a new leader must take over,
more messages are acknowledged, and every acknowledged message must then be
consumed. Teardown removes the project's containers, network and volumes
whatever happened.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgermq.base import loop
from ledgermq.base.errors import UnauthenticatedError
from ledgermq.broker.launcher import node_status
from ledgermq.client.consumer import PullConsumer
from ledgermq.client.producer import Producer
from ledgermq.wire.auth import Credentials
from tests.docker.deployment import SECRETS, Deployment

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

TOPIC = "docker-orders"


async def wait_leader(brokers: dict[int, str], credentials: Credentials,
                      timeout: float) -> int | None:
    """The node that reports itself the ready leader (authenticated BROKER_STATUS)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for nid, address in brokers.items():
            status = await node_status(address, credentials=credentials)
            if status and status.get("role") == "leader" and status.get("leader_ready"):
                return nid
        await asyncio.sleep(0.5)
    return None


@pytest.fixture
def deployment(ledgermq_image: str) -> Iterator[Deployment]:
    dep = Deployment(ledgermq_image)
    started = time.monotonic()
    try:
        dep.compose("up", "-d", "--no-build")
        print(f"\ncompose up: {time.monotonic() - started:.1f} s")
        yield dep
    finally:
        dep.teardown()


async def send_all(namesrv: str, credentials: Credentials, start: int,
                   count: int) -> list[bytes]:
    acked = []
    async with Producer([namesrv], retry_timeout=60.0, name="docker-test",
                        credentials=credentials) as producer:
        for i in range(start, start + count):
            body = f"order-{i}".encode()
            await producer.send(TOPIC, body)
            acked.append(body)
    return acked


async def consume_all(namesrv: str, credentials: Credentials) -> list[bytes]:
    consumer = PullConsumer([namesrv], "docker-test-group", credentials=credentials)
    seen: list[bytes] = []
    try:
        for mq in await consumer.queues(TOPIC, refresh=True):
            low, high = await consumer.queue_range(mq)
            offset = low
            while offset < high:
                result = await consumer.pull(mq, offset, max_messages=256)
                seen += [m.body for m in result.messages]
                offset = result.next_offset
    finally:
        await consumer.close()
    return seen


def test_three_node_compose_survives_losing_the_leader(deployment: Deployment,
                                                       tmp_path: Path) -> None:
    dep = deployment
    brokers = dep.brokers()
    # Authentication is on: every container found or made the same secrets
    # (0600, owned by the servers' user) in the shared volume, and says where
    # the administrator's secret is.
    admin = dep.admin_credentials(tmp_path)
    cluster_secret = dep.secret("namesrv", "cluster.secret")
    for service in ("broker-a-1", "broker-a-2", "broker-a-3"):
        assert dep.secret(service, "cluster.secret") == cluster_secret
        assert dep.secret(service, "admin.secret").strip() == admin.secret
    modes = subprocess.run(["docker", "exec", dep.container("namesrv"), "stat", "-c", "%a %U",
                            f"{SECRETS}/cluster.secret", f"{SECRETS}/admin.secret"],
                           capture_output=True, text=True, timeout=60).stdout.split("\n")
    assert modes[:2] == ["600 ledgermq", "600 ledgermq"], modes
    logs = dep.compose("logs", "--no-color").stdout
    assert f"with the secret in {SECRETS}/admin.secret" in logs, logs[-3000:]
    assert logs.count("secret generated now") >= 1 and "RUNNING OPEN" not in logs

    leader = loop.run(wait_leader(brokers, admin, 120.0))
    assert leader is not None, dep.compose("logs", "--no-color", "--tail", "30").stdout

    async def anonymous() -> None:
        async with Producer([dep.namesrv], retry_timeout=5.0, name="docker-anon") as nobody:
            await nobody.create_topic(TOPIC, queues=4)

    with pytest.raises(UnauthenticatedError):
        loop.run(anonymous())

    async def create_topic() -> None:
        async with Producer([dep.namesrv], retry_timeout=60.0, name="docker-admin",
                            credentials=admin) as producer:
            await producer.create_topic(TOPIC, queues=4)

    loop.run(create_topic())
    acked = loop.run(send_all(dep.namesrv, admin, 0, 200))

    # The servers run unprivileged, with their data on the named volume.
    cid = dep.container(f"broker-a-{leader}")
    uid = subprocess.run(["docker", "exec", cid, "id", "-u"], capture_output=True, text=True,
                         timeout=60).stdout.strip()
    assert uid != "0"
    mounts = subprocess.run(["docker", "inspect", "-f",
                             "{{range .Mounts}}{{.Type}}:{{.Destination}} {{end}}", cid],
                            capture_output=True, text=True, timeout=60).stdout
    assert "volume:/var/lib/ledgermq" in mounts

    dep.compose("stop", f"broker-a-{leader}")
    survivors = {n: a for n, a in brokers.items() if n != leader}
    new_leader = loop.run(wait_leader(survivors, admin, 120.0))
    assert new_leader is not None and new_leader != leader
    acked += loop.run(send_all(dep.namesrv, admin, 200, 100))

    seen = loop.run(consume_all(dep.namesrv, admin))
    missing = set(acked) - set(seen)
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    assert len(set(seen)) == len(acked)

    # The stopped node comes back on its volume (and the shared secrets) and
    # rejoins as a follower; the health checks (a PING authenticated with the
    # cluster key, by the unprivileged user) report every container healthy.
    dep.compose("start", f"broker-a-{leader}")
    services = ["namesrv", "broker-a-1", "broker-a-2", "broker-a-3"]
    deadline = time.monotonic() + 120
    rejoined, health = False, {}
    while time.monotonic() < deadline and not (
            rejoined and set(health.values()) == {"healthy"}):
        rejoined = loop.run(_role(brokers[leader], admin)) == "follower"
        health = {s: subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}",
                                     dep.container(s)], capture_output=True, text=True,
                                    timeout=60).stdout.strip() for s in services}
        time.sleep(1.0)
    assert rejoined and set(health.values()) == {"healthy"}, (rejoined, health)
    checks = subprocess.run(["docker", "inspect", "-f", "{{json .State.Health.Log}}",
                             dep.container("broker-a-1")], capture_output=True, text=True,
                            timeout=60).stdout
    assert "ok as cluster" in checks, checks[-2000:]


async def _role(address: str, credentials: Credentials) -> str | None:
    status = await node_status(address, credentials=credentials)
    return status.get("role") if status else None
