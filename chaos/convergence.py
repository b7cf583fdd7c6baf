"""After a run: did every replica come back and catch up? ("nothing stuck afterwards").

A follower that lost acknowledged entries to a power cut used to answer
heartbeats forever while the leader probed it at the wrong index: the drain
read every message from the leader, the checker said valid, and one replica
stayed behind for good. This check closes that blind spot. Once the writers
have stopped, it takes the leader's commit index as the target and waits until
every node answers, has not failed, and has applied up to the target.

A node listed in `expected_down` (a nemesis meant to leave it down) is
reported but not required.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

StatusFn = Callable[[str], Awaitable[dict[str, Any] | None]]


def _leader_commit(statuses: dict[int, dict[str, Any] | None]) -> int | None:
    best: tuple[int, int] | None = None
    for status in statuses.values():
        if status and status.get("role") == "leader" and status.get("leader_ready"):
            term, commit = int(status.get("term", 0)), int(status.get("commit_index", 0))
            if best is None or term > best[0]:
                best = (term, commit)
    return best[1] if best else None


def _node_view(status: dict[str, Any] | None) -> dict[str, Any]:
    if status is None:
        return {"answered": False}
    return {"answered": True, "role": status.get("role"), "term": status.get("term"),
            "commit_index": status.get("commit_index"),
            "applied_index": status.get("applied_index"),
            "last_index": status.get("last_index"), "failed": status.get("failed")}


async def check_converged(addresses: dict[int, str], status_of: StatusFn, timeout: float,
                          expected_down: Iterable[int] = (), poll_s: float = 0.5
                          ) -> dict[str, Any]:
    """Wait up to `timeout` s for every node (but `expected_down`) to apply the
    leader's commit index; returns the verdict and each node's last view."""
    down = set(expected_down)
    began = time.monotonic()
    deadline = began + timeout
    target: int | None = None
    views: dict[int, dict[str, Any]] = {}
    while True:
        nodes = list(addresses)
        statuses = dict(zip(nodes, await asyncio.gather(
            *(status_of(addresses[n]) for n in nodes)), strict=True))
        if target is None:
            target = _leader_commit(statuses)
        views = {n: _node_view(s) for n, s in statuses.items()}
        behind = [n for n in nodes if n not in down and not _caught_up(views[n], target)]
        if target is not None and not behind:
            return {"converged": True, "target_commit": target, "behind": [],
                    "expected_down": sorted(down), "waited_s": round(time.monotonic() - began, 3),
                    "nodes": views}
        if time.monotonic() >= deadline:
            return {"converged": False, "target_commit": target,
                    "behind": behind if target is not None else nodes,
                    "expected_down": sorted(down), "waited_s": round(time.monotonic() - began, 3),
                    "nodes": views}
        await asyncio.sleep(poll_s)


def _caught_up(view: dict[str, Any], target: int | None) -> bool:
    if target is None or not view.get("answered") or view.get("failed"):
        return False
    applied = view.get("applied_index")
    return applied is not None and int(applied) >= target
