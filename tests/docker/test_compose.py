"""docker/compose.yml end to end: build, deploy, produce, lose the leader, consume.

The 3-node deployment runs exactly as a user would run it (the compose file
unchanged; only its variables: a free /24, a free host port for the published
NameServer, a project name of its own). The host's client SDK finds the
brokers through the NameServer's published port, sends acknowledged
messages, the leader's container is stopped, a new leader must take over,
more messages are acknowledged, and every acknowledged message must then be
consumed. Teardown removes the project's containers, network and volumes
whatever happened.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.docker_backend import container_ids, free_prefix
from chaos.workload import node_status, wait_leader
from ledgermq.base import loop
from ledgermq.client.consumer import PullConsumer
from ledgermq.client.producer import Producer

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker" / "compose.yml"
TOPIC = "docker-orders"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Deployment:
    """One `docker-compose -p <project> -f docker/compose.yml` project."""

    def __init__(self, image: str) -> None:
        self.project = f"lmqtest{os.getpid()}"
        self.net = free_prefix(random.Random())
        self.namesrv_port = free_port()
        self.env = {**os.environ, "LEDGERMQ_IMAGE": image, "LEDGERMQ_NET": self.net,
                    "LEDGERMQ_NAMESRV_PORT": str(self.namesrv_port)}

    def compose(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["docker-compose", "-p", self.project, "-f", str(COMPOSE),
                                 *args], env=self.env, capture_output=True, text=True,
                                timeout=300)
        if check and result.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)}: {result.stderr[-2000:]}")
        return result

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    def brokers(self) -> dict[int, str]:
        return {n: f"{self.net}.{10 + n}:10911" for n in (1, 2, 3)}


@pytest.fixture
def deployment(ledgermq_image: str) -> Iterator[Deployment]:
    dep = Deployment(ledgermq_image)
    started = time.monotonic()
    try:
        dep.compose("up", "-d", "--no-build")
        print(f"\ncompose up: {time.monotonic() - started:.1f} s")
        yield dep
    finally:
        logs = dep.compose("logs", "--no-color", "--tail", "40", check=False).stdout
        down = dep.compose("down", "-v", "--remove-orphans", check=False)
        left = container_ids(dep.project)
        volumes = subprocess.run(["docker", "volume", "ls", "-q", "--filter",
                                  f"label=com.docker.compose.project={dep.project}"],
                                 capture_output=True, text=True, timeout=60).stdout.split()
        assert down.returncode == 0 and not left and not volumes, (down.stderr, left, logs)


async def send_all(namesrv: str, start: int, count: int) -> list[bytes]:
    acked = []
    async with Producer([namesrv], retry_timeout=60.0, name="docker-test") as producer:
        for i in range(start, start + count):
            body = f"order-{i}".encode()
            await producer.send(TOPIC, body)
            acked.append(body)
    return acked


async def consume_all(namesrv: str) -> list[bytes]:
    consumer = PullConsumer([namesrv], "docker-test-group")
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


def test_three_node_compose_survives_losing_the_leader(deployment: Deployment) -> None:
    dep = deployment
    brokers = dep.brokers()
    leader = loop.run(wait_leader(brokers, 120.0))
    assert leader is not None, dep.compose("logs", "--no-color", "--tail", "30").stdout

    async def create_topic() -> None:
        async with Producer([dep.namesrv], retry_timeout=60.0, name="docker-admin") as admin:
            await admin.create_topic(TOPIC, queues=4)

    loop.run(create_topic())
    acked = loop.run(send_all(dep.namesrv, 0, 200))

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
    new_leader = loop.run(wait_leader(survivors, 120.0))
    assert new_leader is not None and new_leader != leader
    acked += loop.run(send_all(dep.namesrv, 200, 100))

    seen = loop.run(consume_all(dep.namesrv))
    missing = set(acked) - set(seen)
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    assert len(set(seen)) == len(acked)

    # The stopped node comes back on its volume and rejoins as a follower; the
    # NameServer's health check (a PING by the unprivileged user) reports healthy.
    dep.compose("start", f"broker-a-{leader}")
    deadline = time.monotonic() + 120
    rejoined = healthy = False
    while time.monotonic() < deadline and not (rejoined and healthy):
        rejoined = loop.run(_role(brokers[leader])) == "follower"
        healthy = subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}",
                                  dep.container("namesrv")], capture_output=True, text=True,
                                 timeout=60).stdout.strip() == "healthy"
        time.sleep(1.0)
    assert rejoined and healthy, (rejoined, healthy)


async def _role(address: str) -> str | None:
    status = await node_status(address)
    return status.get("role") if status else None
