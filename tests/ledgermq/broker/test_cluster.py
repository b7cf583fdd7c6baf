"""Evidence tests on real processes: a NameServer and a broker group on 127.0.0.1.

Every process is started by `broker.launcher.LocalCluster` and stopped by PID.
Waits poll with deadlines; nothing asserts on elapsed time.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ledgermq.base import loop
from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import NotLeaderError, OffsetOutOfRangeError, UnknownTopicError
from ledgermq.broker.launcher import LocalCluster, node_status, wait_leader
from ledgermq.client import Producer, PullConsumer, PushConsumer
from ledgermq.client.model import MessageQueue
from ledgermq.wire import RpcClient

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

SETTINGS = {"segment_size_bytes": 4 << 20, "replicate": "sync", "flush": "async"}


async def until(predicate, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(interval)


async def send_all(producer: Producer, topic: str, count: int, *, in_flight: int = 64,
                   on_acked=None, start: int = 0) -> dict[bytes, str]:
    """Send `count` numbered messages with `in_flight` concurrent sends; body -> msg id."""
    acked: dict[bytes, str] = {}
    sem = asyncio.Semaphore(in_flight)
    failures: list[BaseException] = []

    async def one(i: int) -> None:
        async with sem:
            body = b"m-%06d" % i
            try:
                result = await producer.send(topic, body)
            except Exception as exc:  # counted: an unacknowledged send is not "lost"
                failures.append(exc)
                return
            acked[body] = result.msg_id
            if on_acked is not None:
                on_acked(len(acked))

    await asyncio.gather(*(one(i) for i in range(start, start + count)))
    assert len(failures) <= count // 100, f"too many failed sends: {failures[:3]}"
    return acked


async def consume_all(namesrv: str, group: str, topic: str, expected: set[bytes],
                      timeout: float = 60.0) -> set[bytes]:
    got: set[bytes] = set()
    consumer = PushConsumer([namesrv], group, topic, lambda m: got.add(m.body),
                            long_poll_ms=500, batch_size=256)
    await consumer.start()
    try:
        await until(lambda: expected <= got, timeout, f"{len(expected - got)} messages")
    finally:
        await consumer.stop()
    return got


async def restarted_node_catches_up(cluster: LocalCluster, node: int, leader: int) -> None:
    """The SIGKILLed node restarts, recovers from its files, catches up, and then
    serves the same queues and consumer offsets as the leader."""
    cluster.start_node(node)
    lead = await node_status(cluster.client_address(leader))
    target = lead["commit_index"]

    async def caught_up() -> bool:
        status = await node_status(cluster.client_address(node))
        return bool(status) and status["applied_index"] >= target

    deadline = time.monotonic() + 60
    while not await caught_up():
        assert time.monotonic() < deadline, "restarted node never caught up"
        await asyncio.sleep(0.1)
    views = []
    for nid in (leader, node):
        host, port = split_host_port(cluster.client_address(nid))
        conn = await RpcClient.connect(host, port)
        topics = (await conn.request(RequestCode.GET_TOPICS, None))["topics"]
        offsets = [(await conn.request(RequestCode.QUERY_OFFSET, {
            "group": "cg", "topic": "t", "queue_id": q}))["offset"] for q in range(4)]
        views.append((topics["t"], offsets))
        await conn.close()
    assert views[0] == views[1]
    assert sum(hi for _lo, hi in views[1][0]["offsets"]) >= 9_900


def failover_run(tmp_path, nodes: int, kill: int) -> None:
    async def main() -> None:
        with LocalCluster(tmp_path, nodes=nodes, settings=SETTINGS) as cluster:
            first = await wait_leader(cluster)
            producer = Producer([cluster.namesrv_address], retry_timeout=20.0)
            await producer.create_topic("t", queues=4)
            killed: list[int] = []
            kill_at = asyncio.Event()

            def on_acked(n: int) -> None:
                if n == 3000:
                    kill_at.set()

            async def killer() -> None:
                await kill_at.wait()
                victims = [first, *[n for n in cluster.alive() if n != first][: kill - 1]]
                for nid in victims:
                    cluster.kill(nid)  # SIGKILL, mid-stream
                    killed.append(nid)

            killer_task = asyncio.create_task(killer())
            acked = await send_all(producer, "t", 10_000, on_acked=on_acked)
            await killer_task
            assert killed and killed[0] == first
            new = await wait_leader(cluster, exclude=tuple(killed))
            assert new != first
            assert len(acked) >= 9_900
            got = await consume_all(cluster.namesrv_address, "cg", "t", set(acked))
            lost = set(acked) - got
            assert not lost
            assert producer.retries > 0  # the clients failed over by themselves
            await producer.close()
            if kill == 1:
                await restarted_node_catches_up(cluster, first, new)

    loop.run(main())


def test_three_nodes_leader_sigkill_loses_no_acknowledged_message(tmp_path) -> None:
    failover_run(tmp_path, nodes=3, kill=1)


def test_five_nodes_losing_two_loses_no_acknowledged_message(tmp_path) -> None:
    failover_run(tmp_path, nodes=5, kill=2)


def test_rebalance_broadcast_and_offsets_across_a_leader_change(tmp_path) -> None:
    async def main() -> None:
        with LocalCluster(tmp_path, nodes=3, settings=SETTINGS) as cluster:
            ns = cluster.namesrv_address
            leader = await wait_leader(cluster)
            producer = Producer([ns])
            await producer.create_topic("r", queues=4)
            acked = await send_all(producer, "r", 400)

            # A follower answers writes with NOT_LEADER naming the leader's client
            # address, and serves pulls of committed data.
            follower = next(n for n in cluster.alive() if n != leader)
            host, port = split_host_port(cluster.client_address(follower))
            direct = await RpcClient.connect(host, port)
            deadline = time.monotonic() + 10
            while True:
                with pytest.raises(NotLeaderError) as info:
                    await direct.request(RequestCode.SEND_MESSAGES,
                                         {"messages": [{"topic": "r", "body": b"x"}]})
                # A follower started last may not have heard from the leader
                # yet on a crowded host (its peers' dials back off up to 0.5 s).
                if info.value.leader is not None or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert info.value.leader == cluster.client_address(leader)
            pulled: list[bytes] = []

            async def pull_follower() -> None:
                deadline = time.monotonic() + 20
                while len(pulled) < 400:
                    assert time.monotonic() < deadline, f"follower served {len(pulled)}"
                    pulled.clear()
                    try:
                        for q in range(4):
                            reply = await direct.request(RequestCode.PULL_MESSAGES, {
                                "topic": "r", "queue_id": q, "offset": 0, "max_messages": 256})
                            pulled.extend(m["body"] for m in reply["messages"])
                    except UnknownTopicError:
                        # The follower learns of the commit (of the topic too) with
                        # the leader's next message; until then it may not know "r".
                        pulled.clear()
                    await asyncio.sleep(0.05)

            await pull_follower()
            assert set(pulled) == set(acked)
            # Beyond the end, a follower (which may just be behind) answers
            # "nothing yet" at the consumer's own offset; only the leader says
            # the offset is out of range, so a consumer never rewinds to a
            # lagging follower's end.
            ranges = await direct.request(RequestCode.GET_QUEUE_OFFSETS,
                                          {"topic": "r", "queue_id": 3})
            end = ranges["max_offset"]
            beyond = {"topic": "r", "queue_id": 3, "offset": end + 5, "max_messages": 8}
            behind = await direct.request(RequestCode.PULL_MESSAGES, beyond)
            assert (behind["messages"], behind["next_offset"]) == ([], end + 5)
            await direct.close()
            lhost, lport = split_host_port(cluster.client_address(leader))
            at_leader = await RpcClient.connect(lhost, lport)
            with pytest.raises(OffsetOutOfRangeError) as out_of_range:
                await at_leader.request(RequestCode.PULL_MESSAGES, beyond)
            assert out_of_range.value.data["max_offset"] == end
            await at_leader.close()

            # Clustering: a second member takes half of the queues, and all of
            # them go back to the first when it leaves.
            a_got: list[bytes] = []
            b_got: list[bytes] = []
            a = PushConsumer([ns], "grp", "r", lambda m: a_got.append(m.body), client_id="a",
                             rebalance_interval=0.2, heartbeat_interval=0.2, long_poll_ms=300)
            await a.start()
            await until(lambda: len(a.assigned) == 4, 20, "a owns every queue")
            b = PushConsumer([ns], "grp", "r", lambda m: b_got.append(m.body), client_id="b",
                             rebalance_interval=0.2, heartbeat_interval=0.2, long_poll_ms=300)
            await b.start()
            await until(lambda: len(a.assigned) == 2 and len(b.assigned) == 2, 20,
                        "queues shared out")
            assert set(a.assigned).isdisjoint(b.assigned)
            assert [q.queue_id for q in a.assigned] == [0, 1]
            await until(lambda: set(acked) <= set(a_got) | set(b_got), 30, "all consumed")
            await b.stop()
            await until(lambda: len(a.assigned) == 4, 20, "a takes the queues back")

            # Offsets are committed through the log: a leader change does not rewind them.
            puller = PullConsumer([ns], "grp")
            queues = [MessageQueue("r", "broker-a", q) for q in range(4)]

            async def committed() -> list[int]:
                return [await puller.committed(q) for q in queues]

            before: list[int] = []

            async def settle() -> None:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    before[:] = await committed()
                    if sum(before) == 400:
                        return
                    await asyncio.sleep(0.1)
                raise AssertionError(f"offsets never reached 400: {before}")

            await settle()
            await a.stop()
            cluster.kill(leader)
            await wait_leader(cluster, exclude=(leader,))
            after = await committed()
            assert after == before

            # Broadcasting: every member gets every message, offsets in local files.
            more = await send_all(producer, "r", 100, start=1000)
            c_got: set[bytes] = set()
            d_got: set[bytes] = set()
            c = PushConsumer([ns], "bc", "r", lambda m: c_got.add(m.body), mode="broadcasting",
                             client_id="c", offsets_path=str(tmp_path / "c.json"),
                             long_poll_ms=300)
            d = PushConsumer([ns], "bc", "r", lambda m: d_got.add(m.body), mode="broadcasting",
                             client_id="d", offsets_path=str(tmp_path / "d.json"),
                             long_poll_ms=300)
            await c.start()
            await d.start()
            everything = set(acked) | set(more)
            await until(lambda: everything <= c_got and everything <= d_got, 30,
                        "both broadcast members got everything")
            await c.stop()
            await d.stop()
            assert (tmp_path / "c.json").exists() and (tmp_path / "d.json").exists()
            await puller.close()
            await producer.close()

    loop.run(main())
