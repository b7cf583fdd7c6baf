"""Consumer group membership from client heartbeats (in memory, per node).

Clients heartbeat every node of the groups they consume from, so a new leader
already knows the members after a failover. A member not heard from for
`expiry_ms` is dropped. Pure: the caller passes the clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Member:
    client_id: str
    subscriptions: dict[str, str]
    mode: str
    last_seen_ms: int


class Membership:
    def __init__(self, expiry_ms: int = 10_000) -> None:
        self.expiry_ms = expiry_ms
        self._groups: dict[str, dict[str, Member]] = {}

    def heartbeat(self, group: str, client_id: str, subscriptions: dict[str, str], mode: str,
                  now_ms: int) -> None:
        self._groups.setdefault(group, {})[client_id] = Member(
            client_id, dict(subscriptions), mode, now_ms)

    def leave(self, group: str, client_id: str) -> bool:
        return self._groups.get(group, {}).pop(client_id, None) is not None

    def expire(self, now_ms: int) -> None:
        for name in list(self._groups):
            members = self._groups[name]
            for cid in [c for c, m in members.items() if now_ms - m.last_seen_ms > self.expiry_ms]:
                del members[cid]
            if not members:
                del self._groups[name]

    def members(self, group: str, now_ms: int) -> list[str]:
        """Live member ids of `group`, sorted (clients allocate queues by this order)."""
        self.expire(now_ms)
        return sorted(self._groups.get(group, {}))

    def describe(self, now_ms: int) -> dict[str, Any]:
        self.expire(now_ms)
        return {
            group: [{"client_id": m.client_id, "mode": m.mode, "subscriptions": m.subscriptions,
                     "age_ms": now_ms - m.last_seen_ms} for m in sorted(
                         members.values(), key=lambda m: m.client_id)]
            for group, members in sorted(self._groups.items())
        }
