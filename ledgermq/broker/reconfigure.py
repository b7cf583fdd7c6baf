"""Changing a running group's membership: the operator's operations, each a
sequence of single-server CONFIG entries (docs/operations.md, "Membership").

The Raft core accepts one change at a time and refuses unsafe ones
(`dledger.MembershipChangeRefused`); this module strings them into what an
operator asks for and adds the checks that need a view of the whole group:

- add: the node joins as a learner, is promoted once it has caught up (unless
  it should stay a learner); resumable, like replace;
- remove: refused when the voters left could not form a majority with the
  members that are healthy now (`force` overrides); the leader is never
  removed by itself: it hands leadership over first and the caller retries
  on the new leader (`LeadershipMoved`);
- replace: add the new node, promote it, remove the old one: the group never
  has fewer voters than before, so its fault tolerance never drops;
- rejoin: a member whose data directory is new (wiped, repaired) becomes a
  learner under its new directory id and is promoted again once caught up;
  resumable, like add.

Only the leader runs these; the admin API answers elsewhere with NOT_LEADER.
A leader that stops leading before one of its CONFIG entries commits cannot
know what became of it (`OutcomeUnknown`, 503 OUTCOME_UNKNOWN): the caller
reads the configuration and retries, which the resumable operations make safe.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dledger import MembershipChangeRefused
from dledger.membership import (
    Member,
    Membership,
    MembershipError,
    add_learner,
    promote,
    rejoin,
    remove,
)
from dledger.runtime.node import ProposalUnknown
from ledgermq.broker.runtime import RaftRuntime

# How often progress is looked at while waiting for a learner to catch up.
POLL_S = 0.05


class ReconfigureError(Exception):
    """An operation that cannot be carried out as asked; `status` is the HTTP
    status the admin API answers with (400 bad request, 409 conflict, 503 timeout)."""

    def __init__(self, message: str, status: int = 409, *, transient: bool = False) -> None:
        super().__init__(message)
        self.status = status
        # The core's refusal passes by itself (`MembershipChangeRefused.transient`).
        self.transient = transient


class OutcomeUnknown(ReconfigureError):
    """Leadership changed while a CONFIG entry of the operation was not yet
    committed: the entry may have been cut, or may still commit under the
    new leader. `add`, `replace` and `rejoin` are resumable (they skip what
    is already done), so the answer is: read the configuration and retry, on
    whoever leads now (the CLI does; for `remove` it first looks whether the
    leader's committed configuration already shows it)."""

    def __init__(self, action: str, node_id: int, index: int) -> None:
        super().__init__(
            f"{action} n{node_id}: leadership changed before its configuration entry {index}"
            " committed, so whether it takes effect is unknown: read the configuration"
            " (`ledgermq member list`) and retry the operation", 503)
        self.index = index


class LeadershipMoved(ReconfigureError):
    """This node led and handed leadership to `leader_id` so that it can be
    removed: retry the operation on the new leader."""

    def __init__(self, leader_id: int) -> None:
        super().__init__(f"leadership moved to n{leader_id}: retry there", 409)
        self.leader_id = leader_id


@dataclass(frozen=True)
class Step:
    """One CONFIG entry committed: what changed, at which index, how long it took."""

    action: str
    node_id: int
    index: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "node_id": self.node_id, "index": self.index,
                "seconds": round(self.seconds, 3)}


async def _commit(node: RaftRuntime, action: str, node_id: int,
                  change: Callable[[Membership], Membership], timeout: float) -> Step:
    started = time.monotonic()
    try:
        new = change(node.membership)
    except MembershipError as exc:
        raise ReconfigureError(str(exc), 400) from None
    try:
        index = await node.change_membership(new, timeout)
    except MembershipChangeRefused as exc:
        raise ReconfigureError(f"{action} n{node_id} refused: {exc.reason}",
                               transient=exc.transient) from None
    except TimeoutError:
        raise ReconfigureError(f"{action} n{node_id} was not committed within {timeout:g}s",
                               503) from None
    except ProposalUnknown as exc:
        raise OutcomeUnknown(action, node_id, exc.index) from None
    return Step(action, node_id, index, time.monotonic() - started)


def follower_view(node: RaftRuntime, node_id: int) -> dict[str, Any] | None:
    """The leader's replication view of `node_id` (None if it has none)."""
    status = node.status()
    if status.core is None:
        return None
    follower = status.core.followers.get(node_id)
    return None if follower is None else follower.to_json()


async def wait_caught_up(node: RaftRuntime, node_id: int, timeout: float) -> None:
    """Until `node_id` holds everything the leader had committed when we asked."""
    target = node.commit_index
    deadline = time.monotonic() + timeout
    while True:
        view = follower_view(node, node_id)
        if view is not None and view["match"] >= target:
            return
        if time.monotonic() >= deadline:
            match = view["match"] if view else "unknown"
            raise ReconfigureError(
                f"n{node_id} did not catch up within {timeout:.3g}s (match {match}, "
                f"target {target}){_why_behind(node, node_id, view)}", 503)
        await asyncio.sleep(POLL_S)


def _why_behind(node: RaftRuntime, node_id: int, view: dict[str, Any] | None) -> str:
    """What the leader knows about a member that does not catch up: an
    operator who mistyped an address learns it here, not from a bare timeout."""
    member = node.membership.member(node_id)
    where = f" at {member.address}" if member is not None else ""
    if view is None or not view["directory_id"]:
        why = (f": the leader never heard from it{where}; check that address and that the"
               " node runs")
    elif not view["connected"]:
        why = f": the leader has no connection to it{where} now"
    elif view["identity_mismatch"]:
        why = ": it answers from another data directory than the one pinned (rejoin it)"
    else:
        return ""
    if member is not None and node_id in node.membership.learner_ids:
        why += f"; it stays a learner (member remove --node n{node_id} undoes the add)"
    return why


async def _promote_when_caught_up(node: RaftRuntime, node_id: int, timeout: float) -> Step:
    if node_id not in node.membership.learner_ids:
        raise ReconfigureError(f"n{node_id} is not a learner of the group", 400)
    deadline = time.monotonic() + timeout
    while True:
        await wait_caught_up(node, node_id, max(deadline - time.monotonic(), POLL_S))
        try:
            return await _commit(node, "promote", node_id, lambda m: promote(m, node_id),
                                 max(deadline - time.monotonic(), 1.0))
        except ReconfigureError as exc:
            # A refusal that passes by itself (the learner fell behind again
            # between the look and the change, or a change is still
            # committing: most often the CONFIG entry with which the leader
            # pins a new learner's directory the moment it first hears from
            # it): look again until the deadline.
            if not exc.transient or time.monotonic() >= deadline:
                raise
            await asyncio.sleep(POLL_S)


async def add(node: RaftRuntime, node_id: int, address: str, directory_id: int = 0, *,
              client_address: str = "", learner: bool = False,
              timeout: float = 60.0) -> list[Step]:
    """Add `node_id` (Raft transport at `address`) as a learner, then promote it.

    Resumable, as `replace` is: a node already a learner at `address` (an
    earlier attempt's entry committed, its answer lost) is only promoted, one
    already a voter there is left as it is."""
    member = Member(node_id, address, directory_id, client_address)
    present = node.membership.member(node_id)
    if present is not None and present.address == address:
        if node_id in node.membership.voter_ids:
            return []
        return [] if learner else [await _promote_when_caught_up(node, node_id, timeout)]
    steps = [await _commit(node, "add_learner", node_id, lambda m: add_learner(m, member),
                           timeout)]
    if not learner:
        steps.append(await _promote_when_caught_up(node, node_id, timeout))
    return steps


async def promote_learner(node: RaftRuntime, node_id: int, timeout: float = 60.0) -> list[Step]:
    return [await _promote_when_caught_up(node, node_id, timeout)]


def healthy_voters(node: RaftRuntime) -> set[int]:
    """Voters the leader hears from and that replicate normally (itself included)."""
    status = node.status()
    healthy = {node.node_id}
    if status.core is not None:
        for peer, f in status.core.followers.items():
            if f.state == "REPLICATE" and f.connected and not f.identity_mismatch:
                healthy.add(peer)
    return healthy & node.membership.voter_ids


async def remove_member(node: RaftRuntime, node_id: int, *, force: bool = False,
                        timeout: float = 30.0) -> list[Step]:
    """Remove `node_id`; the leader first hands leadership to a healthy voter."""
    current = node.membership
    if current.member(node_id) is None:
        raise ReconfigureError(f"n{node_id} is not a member of the group", 400)
    if node_id == node.node_id:
        others = sorted(healthy_voters(node) - {node_id})
        if not others:
            raise ReconfigureError("no healthy voter to hand leadership to")
        if not await node.transfer_leadership(others[0], timeout) and (
                node.role == "leader" or not node.leader_id):
            raise ReconfigureError(f"n{others[0]} did not take over within {timeout:g}s", 503)
        # The target, or whoever won instead of it, leads now.
        raise LeadershipMoved(node.leader_id or others[0])
    if node_id in current.voter_ids and not force:
        left = current.voter_ids - {node_id}
        alive = healthy_voters(node) & left
        if len(alive) < len(left) // 2 + 1:
            raise ReconfigureError(
                f"removing n{node_id} would leave {len(left)} voters of which only "
                f"{len(alive)} are healthy ({sorted(alive)}): the group could not commit; "
                "use force to remove anyway")
    return [await _commit(node, "remove", node_id, lambda m: remove(m, node_id), timeout)]


async def replace(node: RaftRuntime, old_id: int, new_id: int, address: str,
                  directory_id: int = 0, *, client_address: str = "",
                  timeout: float = 60.0) -> list[Step]:
    """Add `new_id`, promote it, then remove `old_id`: voters never fewer than now.

    Resumable: each step is skipped when already done, so a retry (after the
    old node, leading, handed leadership over: LeadershipMoved) finishes the
    replacement on the new leader instead of failing on the add."""
    current = node.membership
    if old_id == new_id:
        raise ReconfigureError("the old and the new node are the same", 400)
    if current.member(old_id) is None:
        if new_id in current.voter_ids:
            return []  # already replaced
        raise ReconfigureError(f"n{old_id} is not a member of the group", 400)
    steps: list[Step] = []
    if new_id in current.learner_ids:
        steps.append(await _promote_when_caught_up(node, new_id, timeout))
    elif new_id not in current.voter_ids:
        steps += await add(node, new_id, address, directory_id,
                           client_address=client_address, timeout=timeout)
    # The old node may be dead (that is why it is replaced): the new voter
    # already restored the count, so its removal needs no health check.
    steps += await remove_member(node, old_id, force=True, timeout=timeout)
    return steps


async def rejoin_member(node: RaftRuntime, node_id: int, directory_id: int = 0, *,
                        learner: bool = False, timeout: float = 60.0) -> list[Step]:
    """Re-admit `node_id` under its new data directory (wiped or repaired).

    `directory_id` 0 means the one the leader last heard from the node.
    Resumable, as `add` is: a learner already pinned to that directory (the
    rejoin's entry committed, its promotion did not, or its answer was lost)
    is only promoted, and a healthy voter pinned to it is left as it is."""
    if node_id == node.node_id:
        raise ReconfigureError("a leader does not rejoin itself", 400)
    member = node.membership.member(node_id)
    if member is None:
        raise ReconfigureError(f"n{node_id} is not a member of the group", 400)
    as_heard = not directory_id
    if as_heard:
        view = follower_view(node, node_id)
        directory_id = int(view["directory_id"]) if view else 0
        if not directory_id:
            raise ReconfigureError(
                f"n{node_id} has not been heard from: start it (with its new data directory) "
                "first, or give its directory id", 409)
    if member.directory_id == directory_id:
        if node_id in node.membership.learner_ids:
            return [] if learner else [await _promote_when_caught_up(node, node_id, timeout)]
        if node_id in healthy_voters(node):
            return []  # rejoined and promoted already, or never needed it
        if as_heard:
            # Not heard from its new directory yet: the id heard is the old,
            # wiped one, and pinning it again would never let it vote.
            raise ReconfigureError(
                f"n{node_id} still answers from its pinned directory {directory_id}: it has "
                "not restarted on its new one yet (or was not wiped); retry once it has, or "
                "give --directory-id", 409)
        raise ReconfigureError(
            f"n{node_id} is a voter pinned to directory {directory_id} already; rejoin is "
            "for a node that comes back with a new one", 409)
    steps = [await _commit(node, "rejoin", node_id,
                           lambda m: rejoin(m, node_id, directory_id), timeout)]
    if not learner:
        steps.append(await _promote_when_caught_up(node, node_id, timeout))
    return steps


def members_view(node: RaftRuntime) -> dict[str, Any]:
    """The configuration and, on the leader, each member's replication state."""
    status = node.status()
    membership = node.membership
    followers = status.core.followers if status.core is not None else {}
    rows = []
    for m in membership.voters + membership.learners:
        row: dict[str, Any] = {
            "node_id": m.node_id, "address": m.address, "client_address": m.client_address,
            "directory_id": m.directory_id,
            # Also as text: JavaScript's numbers round 63-bit ids (the dashboard).
            "directory_hex": f"{m.directory_id:016x}",
            "role": membership.role_of(m.node_id), "self": m.node_id == node.node_id,
            "leader": m.node_id == node.leader_id,
        }
        f = followers.get(m.node_id)
        if f is not None:
            row.update({"match": f.match, "lag": f.lag, "state": f.state,
                        "heard_directory_id": f.directory_id,
                        "heard_directory_hex": f"{f.directory_id:016x}",
                        "identity_mismatch": f.identity_mismatch})
        rows.append(row)
    return {
        "group": status.group, "node_id": node.node_id, "leader_id": node.leader_id,
        "membership_index": status.membership_index,
        "membership_pending": status.membership_pending,
        "voters": sorted(membership.voter_ids), "learners": sorted(membership.learner_ids),
        "fault_tolerance": membership.fault_tolerance(),
        "members": rows,
    }
