"""A follower behind retention rejoins by snapshot install: three brokers in
one process on 127.0.0.1 (real Raft and client ports).

One follower stops; the others go on past several small segments, write
snapshots and delete the segments below them (what retention does); when the
follower comes back the entries it needs are gone, so the leader sends its
snapshot and segments. What a consumer can see on the follower — topics,
consumer offsets, queue ranges and contents, the producer table, a deleted
topic staying deleted — must then be the leader's, and stay so as writes go
on and after the follower restarts from the installed snapshot.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.broker.config import BrokerConfig, Peer
from ledgermq.broker.launcher import free_port
from ledgermq.broker.server import Broker
from ledgermq.wire import RpcClient
from tests.node_harness import wait_until

pytestmark = pytest.mark.timeout(180)

SEGMENT = 8192


class Group:
    """Three brokers of group g1, each started and stopped on its own."""

    def __init__(self, root: Path) -> None:
        self.peers = {n: Peer(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
                      for n in (1, 2, 3)}
        self.root = root
        self.brokers: dict[int, Broker] = {}
        self.clients: dict[int, RpcClient] = {}

    def config(self, node_id: int) -> BrokerConfig:
        return BrokerConfig(
            group="g1", node_id=node_id, data_dir=str(self.root / f"n{node_id}"),
            peers=self.peers, segment_size_bytes=SEGMENT, message_size_bytes_max=4096,
            tick_ms=10, snapshot_interval_entries=25, snapshot_interval_bytes=0,
            default_queues=2)

    async def start(self, node_id: int) -> Broker:
        broker = Broker(self.config(node_id))
        host, port = await broker.start()
        self.brokers[node_id] = broker
        self.clients[node_id] = await RpcClient.connect(host, port)
        return broker

    async def stop(self, node_id: int) -> None:
        await self.clients.pop(node_id).close()
        await self.brokers.pop(node_id).stop()

    async def stop_all(self) -> None:
        for node_id in list(self.brokers):
            await self.stop(node_id)

    async def leader(self) -> int:
        async def ready() -> int:
            for node_id, broker in self.brokers.items():
                if broker.node.role == "leader" and broker.node.leader_ready:
                    return node_id
            return 0
        for _ in range(1000):
            if (found := await ready()):
                return found
            await asyncio.sleep(0.01)
        raise AssertionError("no ready leader")

    async def req(self, node_id: int, code: int, body: object) -> Any:
        return await self.clients[node_id].request(code, body)

    async def converged(self) -> int:
        """Every running node has applied the leader's commit index."""
        leader = self.brokers[await self.leader()]
        commit = leader.node.commit_index
        await wait_until(lambda: all(b.state.applied_index >= commit
                                     for b in self.brokers.values()), 20, "convergence")
        return commit


async def visible(group: Group, node_id: int, groups: list[str]) -> dict[str, Any]:
    """What a consumer sees on one node: topics with queue ranges, offsets,
    and every retained message (queue offset, body)."""
    topics = (await group.req(node_id, RequestCode.GET_TOPICS, None))["topics"]
    seen: dict[str, Any] = {"topics": topics, "messages": {}, "offsets": {}}
    for topic, view in topics.items():
        for queue_id, (lo, hi) in enumerate(view["offsets"]):
            messages = []
            offset = lo
            while offset < hi:
                reply = await group.req(node_id, RequestCode.PULL_MESSAGES, {
                    "topic": topic, "queue_id": queue_id, "offset": offset,
                    "max_messages": 256})
                messages += [(m["queue_offset"], m["body"], m["msg_id"])
                             for m in reply["messages"]]
                offset = reply["next_offset"]
            seen["messages"][f"{topic}/{queue_id}"] = messages
            for name in groups:
                seen["offsets"][f"{name}/{topic}/{queue_id}"] = (await group.req(
                    node_id, RequestCode.QUERY_OFFSET,
                    {"group": name, "topic": topic, "queue_id": queue_id}))["offset"]
    return seen


async def send(group: Group, node_id: int, topic: str, i: int) -> dict[str, Any]:
    reply = await group.req(node_id, RequestCode.SEND_MESSAGES, {"messages": [
        {"topic": topic, "body": b"%s-%04d-" % (topic.encode(), i) + b"x" * 100,
         "queue_id": i % 2, "producer_id": 11 if topic == "t" else 12, "sequence": i}]})
    return reply["results"][0]


def retain(broker: Broker, keep_index: int) -> int:
    """Retention by hand: delete the segments below the one holding entry
    `keep_index` (and never past the newest snapshot's end or the
    ConsumeQueue checkpoint)."""
    latest = broker.snapshots.latest
    assert latest is not None
    log_ = broker.node.log
    broker.cq.checkpoint()
    position = log_.segments.base_of(min(latest.end_position - 1,
                                         log_.read_entry(keep_index).position))
    deleted = log_.delete_before(position)
    broker.cq.delete_before(position)
    return deleted


@pytest.mark.parametrize("wipe", [False, True], ids=["restarted", "wiped"])
def test_a_follower_behind_retention_rejoins_by_install_and_sees_what_the_leader_sees(
        tmp_path: Path, wipe: bool) -> None:
    async def main() -> None:
        group = Group(tmp_path)
        for node_id in (1, 2, 3):
            await group.start(node_id)
        try:
            leader = await group.leader()
            await group.req(leader, RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 2})
            for i in range(10):
                await send(group, leader, "gone", i)
            await group.req(leader, RequestCode.DELETE_TOPIC, {"topic": "gone"})
            for i in range(20):
                await send(group, leader, "t", i)
            await group.converged()
            lagger = next(n for n in (1, 2, 3) if n != leader)
            stopped_at = group.brokers[lagger].state.applied_index
            await group.stop(lagger)
            if wipe:  # a new or repaired node: nothing at all on disk
                shutil.rmtree(group.config(lagger).data_dir)

            for i in range(20, 300):
                await send(group, leader, "t", i)
            # Deleted again, late enough for its dead messages to stay in the
            # retained log: the follower's rebuild from it must skip them.
            dead_from = group.brokers[leader].state.applied_index + 1
            for i in range(10, 20):
                await send(group, leader, "gone", i)
            await group.req(leader, RequestCode.DELETE_TOPIC, {"topic": "gone"})
            for i in range(300, 320):
                await send(group, leader, "t", i)
            await group.req(leader, RequestCode.COMMIT_OFFSETS,
                            {"group": "cg", "offsets": [["t", 0, 150], ["t", 1, 151]]})
            await group.converged()
            for broker in group.brokers.values():
                await broker.snapshots.close()
                await broker.snapshots.snapshot_now()
                assert retain(broker, dead_from) > 0
            first_index = group.brokers[leader].node.log.first_index
            assert first_index > stopped_at + 1  # what the lagger needs is gone
            deleted_at = group.brokers[leader].state.deleted_before["gone"]
            assert first_index <= dead_from < deleted_at  # the dead messages are retained

            follower = await group.start(lagger)
            await wait_until(lambda: follower.node.status().counters.installs_received, 30,
                             "the install")
            await group.converged()
            installed = follower.node.status()
            assert installed.first_index == first_index
            assert follower.recovery["snapshot_index"] < installed.snapshot_index

            names = ["cg", "fresh"]
            expected = await visible(group, leader, names)
            assert "gone" not in expected["topics"]
            assert expected["offsets"]["cg/t/0"] == 150
            # Retention moved the queues' first offsets past the deleted segments.
            assert all(lo > 0 for lo, _ in expected["topics"]["t"]["offsets"])
            assert await visible(group, lagger, names) == expected
            # The whole replicated state, producer table included, is the leader's.
            assert follower.state.to_snapshot() == group.brokers[leader].state.to_snapshot()

            # Replication goes on past the snapshot; a retry is a duplicate there too.
            for i in range(320, 340):
                await send(group, leader, "t", i)
            await send(group, leader, "gone", 99)  # the name re-created: offsets from 0
            retry = await send(group, leader, "t", 330)
            assert retry["duplicate"] and retry["queue_offset"] == 165
            await group.converged()
            expected = await visible(group, leader, names)
            assert expected["messages"]["gone/1"] == [(0, b"gone-0099-" + b"x" * 100,
                                                       expected["messages"]["gone/1"][0][2])]
            assert await visible(group, lagger, names) == expected

            # A restart of the follower starts from the installed (or a later) snapshot.
            await group.stop(lagger)
            follower = await group.start(lagger)
            assert follower.recovery["snapshot_index"] >= installed.snapshot_index
            assert follower.recovery["first_index"] == first_index
            await group.converged()
            assert await visible(group, lagger, names) == expected
        finally:
            await group.stop_all()

    loop.run(main())
