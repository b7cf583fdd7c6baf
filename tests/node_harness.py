"""In-process clusters of `RaftGroupNode`s on one event loop, over real TCP (test helper)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import commitlog
from commitlog.snapshot import SnapshotInfo
from dledger.runtime.node import ApplyRest, NodeConfig, RaftGroupNode, SoftStateInfo
from ledgermq.base.ports import free_ports


async def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
                     interval: float = 0.01) -> Any:
    """Poll `predicate` until truthy; fail with `what` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


class Cluster:
    """N nodes; `applied[n]` records every entry node n applied, in order, and
    `installs[n]` every snapshot it installed (then `on_install(n, info)`)."""

    def __init__(self, root: Path, n: int = 3, **knobs: Any) -> None:
        self.root = root
        ports = free_ports(n)
        self.peers = {i + 1: ("127.0.0.1", ports[i]) for i in range(n)}
        self.knobs = knobs
        self.nodes: dict[int, RaftGroupNode] = {}
        self.applied: dict[int, list[commitlog.Entry]] = {}
        self.soft: dict[int, list[SoftStateInfo]] = {}
        self.installs: dict[int, list[SnapshotInfo]] = {}
        self.on_install: Callable[[int, SnapshotInfo], None] | None = None
        # Per node: the id of its data directory (0 unless a test sets one).
        self.directory_ids: dict[int, int] = {}
        # What each apply leaves for later in its pass (RaftGroupNode's ApplyRest).
        self.apply_rest: Callable[[int, Sequence[commitlog.Entry]], ApplyRest | None] | None = (
            None)

    def config(self, node_id: int) -> NodeConfig:
        return NodeConfig(group="g1", node_id=node_id, peers=self.peers,
                          data_dir=str(self.root / f"n{node_id}"),
                          segment_size_bytes=1 << 20,
                          directory_id=self.directory_ids.get(node_id, 0), **self.knobs)

    async def start(self, node_id: int, applied_index: int = 0,
                    node: RaftGroupNode | None = None) -> RaftGroupNode:
        applied: list[commitlog.Entry] = []
        self.applied[node_id] = applied
        self.soft[node_id] = []
        installs = self.installs.setdefault(node_id, [])

        def apply(entries: Sequence[commitlog.Entry]) -> ApplyRest | None:
            applied.extend(entries)
            return None if self.apply_rest is None else self.apply_rest(node_id, entries)

        def installed(info: SnapshotInfo) -> None:
            installs.append(info)
            if self.on_install is not None:
                self.on_install(node_id, info)

        if node is None:
            node = RaftGroupNode(self.config(node_id), apply, self.soft[node_id].append,
                                 on_install=installed)
        else:
            node._apply_cb = apply
        await node.start(applied_index)
        self.nodes[node_id] = node
        return node

    async def start_all(self, only: Sequence[int] | None = None) -> None:
        for node_id in (self.peers if only is None else only):
            await self.start(node_id)

    async def stop(self, node_id: int) -> None:
        node = self.nodes.pop(node_id)
        await node.stop()

    async def start_pinned(self) -> RaftGroupNode:
        """Start every node under directory id 100 + its id; returns the
        leader once it has pinned every member's directory."""
        self.directory_ids = {n: 100 + n for n in self.peers}
        await self.start_all()
        leader = await self.wait_leader()
        await wait_until(lambda: not leader.membership.unpinned(), 10.0, "pinned members")
        return leader

    async def wipe(self, node_id: int, directory_id: int, leader: RaftGroupNode) -> None:
        """Stop `node_id`, delete its data directory and start it again under
        `directory_id`; returns once `leader` flags the new directory."""
        await self.stop(node_id)
        shutil.rmtree(self.root / f"n{node_id}")
        self.directory_ids[node_id] = directory_id
        await self.start(node_id)

        def flagged() -> bool:
            core = leader.status().core
            return core is not None and core.followers[node_id].identity_mismatch

        await wait_until(flagged, 10.0, f"the leader sees n{node_id}'s new directory")

    async def stop_all(self) -> None:
        for node_id in list(self.nodes):
            await self.stop(node_id)

    def ready_leader(self) -> RaftGroupNode | None:
        leaders = [n for n in self.nodes.values() if n.leader_ready]
        return leaders[0] if len(leaders) == 1 else None

    async def wait_leader(self, timeout: float = 15.0) -> RaftGroupNode:
        node = await wait_until(self.ready_leader, timeout, "a ready leader")
        assert isinstance(node, RaftGroupNode)
        return node

    async def wait_converged(self, timeout: float = 15.0) -> int:
        """Every running node applied up to the leader's commit index; returns it."""
        def converged() -> int | None:
            leader = self.ready_leader()
            if leader is None:
                return None
            commit = leader.commit_index
            if all(n.applied_index >= commit for n in self.nodes.values()):
                return commit
            return None
        result = await wait_until(converged, timeout, "all nodes applied the leader's commit")
        return int(result)


def log_entries(node: RaftGroupNode, hi: int) -> list[tuple[int, int, int, int, bytes]]:
    return [(e.index, e.term, e.kind, e.position, e.body)
            for e in node.log.read_entries(1, hi + 1)]
