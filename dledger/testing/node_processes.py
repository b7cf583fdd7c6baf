"""Clusters of real node processes (`dledger.runtime.process`) for tests and benchmarks.

Every process is started through `ledgermq.base.processes` and signalled only
by its own PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger.runtime.process import CONTROL_ENTRIES, CONTROL_PROPOSE, CONTROL_STATUS
from ledgermq.base.ports import free_ports
from ledgermq.base.processes import Child, spawn
from ledgermq.wire.rpc_client import RpcClient

_LISTENING = re.compile(r"raft-node (\d+) control (\S+):(\d+)")


@dataclass
class NodeProcess:
    """A running node: its process and its control address."""

    node_id: int
    child: Child
    control: tuple[str, int]


class ProcessCluster:
    """N node processes of one group on 127.0.0.1; `knobs` go into every config
    (e.g. `cluster_secret_file`, `tls_cert_file`), `node_knobs[id]` into one
    node's on top (a node with another secret)."""

    def __init__(self, root: Path, n: int = 3, **knobs: Any) -> None:
        self.root = Path(root)
        ports = free_ports(n)
        self.peers = {i + 1: ("127.0.0.1", ports[i]) for i in range(n)}
        self.knobs = knobs
        self.node_knobs: dict[int, dict[str, Any]] = {}
        self.procs: dict[int, NodeProcess] = {}
        self._clients: dict[int, RpcClient] = {}

    def write_config(self, node_id: int) -> Path:
        path = self.root / f"node{node_id}.json"
        cfg = {"group": "g1", "node_id": node_id, "data_dir": str(self.root / f"n{node_id}"),
               "peers": {str(k): list(v) for k, v in self.peers.items()},
               "control": "127.0.0.1:0", **self.knobs, **self.node_knobs.get(node_id, {})}
        path.write_text(json.dumps(cfg))
        return path

    def start(self, node_id: int, ready_timeout: float = 30.0) -> NodeProcess:
        child = spawn(f"node {node_id}", [sys.executable, "-m", "dledger.runtime.process",
                                          "--config", str(self.write_config(node_id))],
                      _LISTENING)
        m = child.wait_ready(ready_timeout)
        node = NodeProcess(node_id, child, (m.group(2), int(m.group(3))))
        self.procs[node_id] = node
        return node

    async def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        node = self.procs.pop(node_id)
        node.child.signal(sig)
        await asyncio.get_running_loop().run_in_executor(None, node.child.wait, 15.0)
        client = self._clients.pop(node_id, None)
        if client is not None:
            await client.close()

    async def stop_all(self) -> None:
        for node_id in list(self.procs):
            await self.kill(node_id, signal.SIGTERM)

    async def client(self, node_id: int) -> RpcClient:
        client = self._clients.get(node_id)
        if client is None or client.closed:
            host, port = self.procs[node_id].control
            client = await RpcClient.connect(host, port, role="admin", timeout=5.0)
            self._clients[node_id] = client
        return client

    async def status(self, node_id: int) -> dict[str, Any] | None:
        try:
            client = await self.client(node_id)
            result = await client.request(CONTROL_STATUS, None, timeout=2.0)
        except Exception:  # a dead or restarting node simply has no status
            self._clients.pop(node_id, None)
            return None
        return result if isinstance(result, dict) else None

    async def ready_leader(self) -> int:
        """Id of the single running node reporting leader_ready, else 0."""
        found = []
        for node_id in list(self.procs):
            st = await self.status(node_id)
            if st and st.get("leader_ready"):
                found.append(node_id)
        return found[0] if len(found) == 1 else 0

    async def wait_leader(self, timeout: float = 20.0, poll: float = 0.01) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            leader = await self.ready_leader()
            if leader:
                return leader
            await asyncio.sleep(poll)
        # Say what each node believes: a stuck election is debugged from this.
        seen = {}
        for node_id in sorted(self.procs):
            st = await self.status(node_id)
            seen[node_id] = None if st is None else {
                k: st.get(k) for k in ("role", "term", "vote", "leader_id", "last_index",
                                       "commit_index", "membership_index", "directory_id",
                                       "failed")}
        raise AssertionError(f"no ready leader within {timeout} s: {seen}")

    async def propose(self, node_id: int, data: bytes, timeout: float = 3.0) -> dict[str, Any]:
        client = await self.client(node_id)
        reply: dict[str, Any] = await client.request(
            CONTROL_PROPOSE, {"data": data, "timeout": timeout}, timeout=timeout + 2.0)
        return reply

    async def entries(self, node_id: int) -> list[tuple[int, int, bytes]]:
        """Every committed entry of `node_id`, paging through ENTRIES."""
        client = await self.client(node_id)
        out: list[tuple[int, int, bytes]] = []
        lo = 1
        while True:
            page = await client.request(CONTROL_ENTRIES, {"lo": lo, "hi": 1 << 62}, timeout=10.0)
            if not page:
                return out
            out += [(int(i), int(t), bytes(b)) for i, t, b in page]
            lo = out[-1][0] + 1

    async def close_clients(self) -> None:
        for client in list(self._clients.values()):
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()
