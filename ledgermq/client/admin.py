"""Administrative queries: cluster view, topics, per-node status.

What `ledgermq topic` and `ledgermq status` show; usable from scripts too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import LedgerMQError
from ledgermq.client.routes import RETRIABLE, Cluster


class Admin:
    """Read-only cluster queries over the wire protocol (no admin app needed)."""

    def __init__(self, namesrv: Sequence[str], timeout: float = 3.0) -> None:
        self.cluster = Cluster(tuple(namesrv), name="admin", timeout=timeout)

    async def close(self) -> None:
        await self.cluster.close()

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def cluster_view(self) -> dict[str, Any]:
        """The NameServer's GET_CLUSTER answer: {groups: {name: {leader, nodes}}}."""
        view: dict[str, Any] = await self.cluster.namesrv_request(RequestCode.GET_CLUSTER, None)
        return view

    async def node_status(self, address: str) -> dict[str, Any] | None:
        """A node's BROKER_STATUS answer, or None when it does not answer."""
        with contextlib.suppress(*RETRIABLE, LedgerMQError):
            status: dict[str, Any] = await self.cluster.request(
                address, RequestCode.BROKER_STATUS, None, timeout=1.5)
            return status
        return None

    async def status(self) -> dict[str, list[dict[str, Any]]]:
        """Per group, every registered node's status (None fields if unreachable)."""
        view = await self.cluster_view()
        out: dict[str, list[dict[str, Any]]] = {}
        for group, info in sorted(view.get("groups", {}).items()):
            nodes = info.get("nodes", [])
            statuses = await asyncio.gather(*(self.node_status(n["address"]) for n in nodes))
            rows = []
            for node, status in zip(nodes, statuses, strict=True):
                rows.append({"node_id": node["node_id"], "address": node["address"],
                             "registered_role": node.get("role"), "status": status})
            out[group] = rows
        return out

    async def topics(self) -> dict[str, dict[str, Any]]:
        """Every topic a leader reports, with its queue offsets ({group: ...} inside)."""
        view = await self.cluster_view()
        result: dict[str, dict[str, Any]] = {}
        for group, info in sorted(view.get("groups", {}).items()):
            addresses = [n["address"] for n in info.get("nodes", [])
                         if n.get("node_id") == info.get("leader")]
            addresses += [n["address"] for n in info.get("nodes", [])
                          if n["address"] not in addresses]
            for address in addresses:
                with contextlib.suppress(*RETRIABLE, LedgerMQError):
                    reply = await self.cluster.request(address, RequestCode.GET_TOPICS, None)
                    for topic, cfg in reply["topics"].items():
                        result.setdefault(topic, {})[group] = cfg
                    break
        return result
