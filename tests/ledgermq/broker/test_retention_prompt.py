"""Retention deletes as soon as it may, on every replica: three brokers in one
process on 127.0.0.1 (real Raft and client ports, small segments), with
`retention_interval_ms` an hour, so whatever is deleted here was deleted by
a pass something other than the interval started:

- a follower applying a `log.trim` that raises the agreed point deletes
  then, not at its own next interval;
- a replica whose own snapshot is all that holds deletion back writes one
  rather than waiting for its snapshot schedule;
- the leader re-runs the size rule whenever its log starts a new segment,
  and the rule leaves room below `retention_bytes` for what the log grew
  between passes, so the segments never settle above the limit.
"""

from __future__ import annotations

import asyncio
import os
import time
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

pytestmark = pytest.mark.timeout(120)

SEGMENT = 16 * 1024
BODY = 1000
HOUR_MS = 3_600_000


class Group:
    """Three brokers of group g1 in this process."""

    def __init__(self, root: Path, **overrides: Any) -> None:
        self.peers = {n: Peer(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
                      for n in (1, 2, 3)}
        self.root = root
        self.overrides = overrides
        self.brokers: dict[int, Broker] = {}
        self.clients: dict[int, RpcClient] = {}

    def config(self, node_id: int) -> BrokerConfig:
        values: dict[str, Any] = dict(
            group="g1", node_id=node_id, data_dir=str(self.root / f"n{node_id}"),
            peers=self.peers, segment_size_bytes=SEGMENT, message_size_bytes_max=4096,
            tick_ms=10, default_queues=2, retention_interval_ms=HOUR_MS,
            # Whatever this machine's disk holds, only the rule under test deletes.
            disk_soft_ratio=1.0, disk_hard_ratio=1.0)
        values.update(self.overrides)
        return BrokerConfig(**values)

    async def __aenter__(self) -> Group:
        for node_id in (1, 2, 3):
            broker = Broker(self.config(node_id))
            host, port = await broker.start()
            self.brokers[node_id] = broker
            self.clients[node_id] = await RpcClient.connect(host, port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for node_id in list(self.brokers):
            await self.clients.pop(node_id).close()
            await self.brokers.pop(node_id).stop()

    async def leader(self) -> int:
        def ready() -> int:
            return next((n for n, b in self.brokers.items()
                         if b.node.role == "leader" and b.node.leader_ready), 0)
        return int(await wait_until(ready, 20, "a ready leader"))

    async def send(self, count: int) -> None:
        """`count` messages, one request (one entry) each, through the leader."""
        leader = await self.leader()
        for i in range(count):
            await self.clients[leader].request(RequestCode.SEND_MESSAGES, {"messages": [
                {"topic": "T", "body": b"%06d" % i + b"." * (BODY - 6)}]})

    async def converged(self) -> None:
        """Every node has applied the leader's commit index."""
        commit = self.brokers[await self.leader()].node.commit_index
        await wait_until(lambda: all(b.state.applied_index >= commit
                                     for b in self.brokers.values()), 20, "convergence")


def segment_bytes(broker: Broker) -> int:
    return sum(s.length for s in broker.node.log.segment_infos())


def first_base(broker: Broker) -> int:
    return broker.node.log.segment_infos()[0].base


def test_every_replica_deletes_when_the_trim_is_applied_and_snapshots_for_it(
        tmp_path: Path) -> None:
    """No size or age rule, snapshots on but never due: an operator's trim
    is the only thing that deletes. Every replica deletes up to it without
    waiting for an interval (an hour) or a scheduled snapshot (never)."""

    async def main() -> None:
        async with Group(tmp_path, retention_hours=0, snapshot_interval_entries=0,
                         snapshot_interval_bytes=1 << 40) as group:
            await group.clients[await group.leader()].request(
                RequestCode.CREATE_TOPIC, {"topic": "T", "queues": 2})
            await group.send(120)  # ~7 segments
            await group.converged()
            brokers = group.brokers
            assert all(b.snapshots.latest is None for b in brokers.values())
            leader = brokers[await group.leader()]
            retention = leader.retention
            assert retention is not None
            answer = await retention.manual_trim(index=leader.state.applied_index)
            point = answer["position"]
            assert point >= 4 * SEGMENT

            await wait_until(lambda: all(first_base(b) == point for b in brokers.values()),
                             30, "every replica to delete up to the agreed point")
            for broker in brokers.values():
                assert broker.state.trim == point
                assert broker.node.log.first_index > 1
                # Its own snapshot, written because deletion waited on it.
                assert broker.retention is not None
                assert broker.retention.counters.snapshots_requested >= 1
                latest = broker.snapshots.latest
                assert latest is not None and latest.end_position >= point
            # The replicas kept the same bytes from the same point.
            names = {n: sorted(os.listdir(Path(b.config.data_dir) / "commitlog"))
                     for n, b in brokers.items()}
            assert len({tuple(v) for v in names.values()}) == 1, names

    loop.run(main())


def test_the_leader_cuts_at_each_new_segment_below_the_size_limit(tmp_path: Path) -> None:
    """A size limit of 6 segments and writes of ~15: the leader deletes while
    they go on although the interval is an hour (its log starting segments
    starts passes); at rest it keeps at most the limit less the growth the
    passes measured, and every replica follows it."""
    limit = 6 * SEGMENT

    async def main() -> None:
        async with Group(tmp_path, retention_bytes=limit,
                         snapshot_interval_entries=10) as group:
            await group.clients[await group.leader()].request(
                RequestCode.CREATE_TOPIC, {"topic": "T", "queues": 2})
            await group.send(230)
            brokers = group.brokers
            leader = brokers[await group.leader()]
            retention = leader.retention
            assert retention is not None
            await wait_until(lambda: retention.counters.segments_deleted > 0, 30,
                             "the leader to delete at a new segment")
            await group.converged()
            # At rest, what it keeps is the limit less the room. A pass may be
            # held a moment by the ConsumeQueue checkpoint or a snapshot being
            # written (a loaded machine): passes until the cut is made.
            deadline = time.monotonic() + 30
            while True:
                await retention.run_once()
                decision = retention.last_decision
                assert decision is not None and retention.growths and decision.headroom > 0
                kept = segment_bytes(leader)
                if kept <= limit - decision.headroom or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            assert kept <= limit - decision.headroom
            assert retention.counters.segments_deleted >= 14 - 6
            await wait_until(lambda: all(first_base(b) == leader.state.trim
                                         for b in brokers.values()), 30,
                             "every replica to reach the agreed point")
            for broker in brokers.values():
                assert segment_bytes(broker) == kept
                assert broker.node.log.first_index > 1

    loop.run(main())
