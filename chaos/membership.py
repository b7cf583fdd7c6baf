"""Membership nemeses: add, remove, replace and repair nodes while the workload runs.

Each is an operator at work, through the nodes' admin apps
(chaos.members_api, the API `ledgermq member` uses): one operation per fault
period, recorded in the history like every nemesis action (an invoke when it
begins, an info with what was done when it ends) with, for every CONFIG entry
the group committed, its index and its wall-clock window, from which the
report measures each step's availability gap (chaos.membership_report).

- `replace-each`: replace every original node, one per period, by a spare
  (`member replace`: the spare joins as a learner, is promoted once caught
  up, then the old node is removed; the leader hands over first).
- `grow` (param target, default 5): add spares one per period until the group
  has `target` voters.
- `shrink` (param target, default 3; leader=1 to allow removing the leader):
  remove a random follower per period until `target` voters are left.
- `remove-leader` (params count, default 1; min_voters, default 3): remove the
  leader (it hands over first); when that would leave fewer than
  `min_voters` voters, a spare is added first.
- `wipe-repair` (params mode wipe|corrupt, count default 1): kill a pinned
  follower and wipe its data directory (mode wipe) or damage its hard state
  so it refuses to start and `ledgermq node repair` moves the directory aside
  (mode corrupt); on the period's end start it again with its usual command,
  check that it cannot vote (the leader flags an identity mismatch: its
  messages carry a directory id other than the pinned one) and that it did
  not become leader, then `member rejoin` it and wait until it is a voter
  again under its new directory id.
- `membership` (params min_voters 3, max_voters 5): random churn, one of
  add, remove, remove-leader, replace and wipe-repair per period, chosen
  among those the current configuration allows, mixed with any other nemesis
  of the run (kills and partitions included). A learner left behind by a
  change cut short by a fault is promoted at the period's end.

What the harness believes the group is (`Backend.node_ids`, the members the
other nemeses target and the final checks expect up) is always re-read from
the leader after a change, never assumed. A removed node is stopped and its
data directory set aside under the run's `removed/`; a spare that joins is
started first (a node removed earlier comes back as a new machine: an empty
data directory, and a configuration in which it is not a bootstrap member).

The plan nemeses (`replace-each`, `grow`, `shrink`, `remove-leader`,
`wipe-repair`) say what configuration they intend (`intended`) and when they
are done (`finished`); every one of their steps must succeed, and the group
must end in the intended configuration. Churn steps may be refused or cut
short by the faults around them: they are reported, and only the
configuration's consistency is required of them.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from chaos import disk_faults
from chaos.members_api import Change, MemberApi, View, configuration, member_row
from chaos.nemesis import Context, Nemesis, _Restarting

# How long each operator operation may take, retries included.
CHANGE_TIMEOUT = 60.0
# How long a pinned directory id, or the leader's flag on a wiped node, may take to show.
IDENTITY_TIMEOUT = 20.0


def voters(view: View | None) -> list[int]:
    return sorted(int(n) for n in (view or {}).get("voters", []))


def learners(view: View | None) -> list[int]:
    return sorted(int(n) for n in (view or {}).get("learners", []))


def members(view: View | None) -> list[int]:
    return sorted(set(voters(view)) | set(learners(view)))


@dataclass
class Step:
    """One membership step as the history records it (`detail["membership"]`)."""

    kind: str  # replace, add, remove, remove-leader, wipe, repair, promote
    nodes: dict[str, Any]
    required: bool  # a plan step (must succeed) or churn (reported)
    started_ns: int = field(default_factory=time.time_ns)
    finished_ns: int = 0
    ok: bool = False
    changes: list[Change] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    after: View | None = None

    def to_json(self) -> dict[str, Any]:
        return {"step": self.kind, "nodes": self.nodes, "required": self.required,
                "started_ns": self.started_ns, "finished_ns": self.finished_ns or time.time_ns(),
                "ok": self.ok, "changes": [c.to_json() for c in self.changes],
                "checks": self.checks, "error": self.error,
                "configuration": configuration(self.after)}


class _Membership(_Restarting):
    """What the membership nemeses share: the admin client, the group's view,
    bringing nodes up and taking them out."""

    needs: ClassVar[tuple[str, ...]] = ("membership",)
    # A plan's steps must all succeed; churn's are reported.
    required: ClassVar[bool] = True
    # Repairs and reconciliations at a period's end run once the faults of
    # that period are healed (chaos.schedule stops these last).
    stop_last: ClassVar[bool] = True
    # How long one operator operation may take, retries included.
    change_timeout: ClassVar[float] = CHANGE_TIMEOUT

    @property
    def plan_unfinished(self) -> bool:
        return self.required and not self.finished

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._api: MemberApi | None = None
        self.steps_done = 0

    @classmethod
    def spares_needed(cls, nodes: int, params: dict[str, Any]) -> int:
        """How many spare nodes a run of `nodes` needs for this nemesis."""
        return 0

    def intended(self, original: list[int], spares: list[int]) -> dict[str, Any] | None:
        """The configuration this nemesis means to leave: {"voters": ids or None,
        "count": how many voters}; None when it intends none (churn)."""
        return None

    def use_api(self, api: MemberApi) -> None:
        """Share another nemesis's admin client (and its leader hint)."""
        self._api = api

    def api(self, ctx: Context) -> MemberApi:
        if self._api is None or self._api.backend is not ctx.backend:
            self._api = MemberApi(ctx.backend, ctx.log)
        return self._api

    def stop(self, ctx: Context) -> dict[str, Any]:
        return {"nothing_to_undo": True}

    # ------------------------------------------------------------ the group

    def view(self, ctx: Context) -> View | None:
        """The leader's view, waited for (a step may follow a failover)."""
        view, _ = self.api(ctx).wait_view(lambda v: True, 30.0)
        return view

    def sync(self, ctx: Context, view: View | None) -> None:
        """Believe what the group says: its members become the backend's."""
        if view is not None:
            ctx.backend.set_members(members(view))

    def pool(self, ctx: Context) -> list[int]:
        """Nodes that may join: spares never started first, then nodes removed earlier."""
        current = set(ctx.backend.node_ids)
        fresh = [n for n in ctx.backend.all_node_ids if n not in current
                 and n not in ctx.backend.removed and not ctx.backend.node_alive(n)]
        again = [n for n in ctx.backend.removed if not ctx.backend.node_alive(n)]
        return fresh + again

    def bring_up(self, ctx: Context, node: int, step: Step) -> bool:
        """Start `node` as a new machine (a node removed earlier gets an empty data
        directory and a configuration that does not make it a bootstrap member)."""
        if ctx.backend.node_alive(node):
            return True
        if node in ctx.backend.removed:
            ctx.backend.provision(node)
        ctx.backend.start_node(node)
        ready = ctx.backend.wait_node(node, ctx.restart_timeout)
        ctx.restarts.append({**ready.as_dict(), "node": node, "nemesis": self.name,
                             "allowed": False})
        step.checks[f"n{node}_started"] = ready.ready
        if not ready.ready:
            step.error = f"n{node} did not start: {ready.reason}"
        return ready.ready

    def retire(self, ctx: Context, node: int, step: Step) -> None:
        """`node` left the group: stop it, set its data aside, never expect it back."""
        stopped = ctx.backend.stop_node(node)
        where = ctx.backend.set_aside_data(node, "removed") if stopped else None
        ctx.backend.mark_removed(node)
        step.checks[f"n{node}_retired"] = {"stopped": stopped,
                                           "data": str(where) if where else None}

    def change(self, ctx: Context, step: Step, action: str, body: dict[str, Any],
               done: Any) -> Change:
        result = self.api(ctx).change(action, body, timeout=self.change_timeout, done=done)
        step.changes.append(result)
        return result

    def finish(self, ctx: Context, step: Step, ok: bool) -> dict[str, Any]:
        step.after = self.api(ctx).leader_view() or step.after
        self.sync(ctx, step.after)
        step.ok = ok and step.error is None
        step.finished_ns = time.time_ns()
        if step.ok:
            self.steps_done += 1
        return {"membership": [step.to_json()]}

    # ------------------------------------------------------------ operations

    def do_add(self, ctx: Context, node: int, step: Step) -> bool:
        """`member add`: learner, then voter once caught up."""
        if not self.bring_up(ctx, node, step):
            return False
        body = {"node_id": node, "address": ctx.backend.raft_address(node),
                "client_address": ctx.backend.client_address(node)}
        added = self.change(ctx, step, "add", body, lambda v: node in voters(v))
        if not added.ok:
            self.complete_promotion(ctx, node, step)
        view = self.api(ctx).leader_view()
        step.after = view
        return node in voters(view)

    def complete_promotion(self, ctx: Context, node: int, step: Step) -> None:
        """A change cut short with `node` still a learner: promote it."""
        view = self.api(ctx).leader_view()
        if node in learners(view):
            self.change(ctx, step, "promote", {"node_id": node}, lambda v: node in voters(v))

    def do_remove(self, ctx: Context, node: int, step: Step, force: bool = False) -> bool:
        """`member remove` (a leader hands over first; retried on the new leader)."""
        removed = self.change(ctx, step, "remove", {"node_id": node, "force": force},
                              lambda v: node not in members(v))
        view = removed.view if removed.ok and not removed.already_done else None
        view = view or self.api(ctx).leader_view()
        step.after = view
        if view is not None and node not in members(view):
            self.retire(ctx, node, step)
            return True
        return False

    def do_replace(self, ctx: Context, old: int, new: int, step: Step) -> bool:
        """`member replace`: add the new node, promote it, remove the old one. When
        the operation stops half-way (a fault, or a retry on a new leader that
        finds the new node already added), the rest is done with the single
        operations, and said so in the step."""
        if not self.bring_up(ctx, new, step):
            return False
        body = {"node_id": old, "new_node_id": new, "address": ctx.backend.raft_address(new),
                "client_address": ctx.backend.client_address(new)}
        replaced = self.change(ctx, step, "replace", body,
                               lambda v: new in voters(v) and old not in members(v))
        if not replaced.ok:
            step.checks["completed_with_single_operations"] = True
            self.complete_promotion(ctx, new, step)
            view = self.api(ctx).leader_view()
            if new in voters(view) and old in members(view):
                self.change(ctx, step, "remove", {"node_id": old, "force": True},
                            lambda v: old not in members(v))
        view = self.api(ctx).leader_view()
        step.after = view
        if view is not None and old not in members(view):
            self.retire(ctx, old, step)
        return view is not None and new in voters(view) and old not in members(view)

    def leader(self, ctx: Context) -> int | None:
        view = self.view(ctx)
        return None if view is None else int(view["node_id"])


# ---------------------------------------------------------------- the plans


class ReplaceEach(_Membership):
    name = "replace-each"
    doc = ("Replace every original node by a spare, one per period (member replace: learner, "
           "promoted once caught up, then the old node removed; a leader hands over first). "
           "Needs as many spares as nodes.")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._plan: list[tuple[int, int]] | None = None

    @classmethod
    def spares_needed(cls, nodes: int, params: dict[str, Any]) -> int:
        return nodes

    def intended(self, original: list[int], spares: list[int]) -> dict[str, Any]:
        return {"voters": spares[:len(original)], "count": len(original)}

    def plan(self, ctx: Context) -> list[tuple[int, int]]:
        if self._plan is None:
            original = ctx.backend.spec.original_ids
            spares = [n for n in ctx.backend.all_node_ids if n not in original]
            if len(spares) < len(original):
                raise ValueError(f"replace-each needs {len(original)} spares, the run has "
                                 f"{len(spares)}")
            self._plan = list(zip(original, spares, strict=False))
        return self._plan

    @property
    def finished(self) -> bool:
        return self._plan is not None and self.steps_done >= len(self._plan)

    def start(self, ctx: Context) -> dict[str, Any]:
        plan = self.plan(ctx)
        if self.steps_done >= len(plan):
            return {"idle": "every original node is replaced"}
        old, new = plan[self.steps_done]
        step = Step("replace", {"old": old, "new": new,
                                "old_was_leader": self.leader(ctx) == old}, self.required)
        ok = self.do_replace(ctx, old, new, step)
        detail = self.finish(ctx, step, ok)
        if not step.ok:
            # Not retried: the plan stops at a failed step and the run says so.
            self._plan = plan[:self.steps_done]
        return detail


class Grow(_Membership):
    name = "grow"
    doc = "Add spares one per period (member add) until the group has `target` voters (5)."

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.target = int(params.get("target", 5))
        self._done = False

    @classmethod
    def spares_needed(cls, nodes: int, params: dict[str, Any]) -> int:
        return max(0, int(params.get("target", 5)) - nodes)

    def intended(self, original: list[int], spares: list[int]) -> dict[str, Any]:
        grown = spares[:max(0, self.target - len(original))]
        return {"voters": original + grown, "count": self.target}

    @property
    def finished(self) -> bool:
        return self._done

    def start(self, ctx: Context) -> dict[str, Any]:
        view = self.view(ctx)
        if view is not None and len(voters(view)) >= self.target:
            self._done = True
            return {"idle": f"the group has {len(voters(view))} voters"}
        spare = next(iter(self.pool(ctx)), None)
        step = Step("add", {"node": spare}, self.required)
        if spare is None:
            step.error = "no spare left to add"
            self._done = True
            return self.finish(ctx, step, False)
        detail = self.finish(ctx, step, self.do_add(ctx, spare, step))
        if not step.ok or len(voters(step.after)) >= self.target:
            self._done = True
        return detail


class Shrink(_Membership):
    name = "shrink"
    doc = ("Remove a random follower per period (member remove) until `target` voters (3) "
           "are left; leader=1 lets the leader be picked too (it hands over first).")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.target = int(params.get("target", 3))
        self.with_leader = str(params.get("leader", "0")) in ("1", "true", "yes")
        self._done = False

    def intended(self, original: list[int], spares: list[int]) -> dict[str, Any]:
        return {"voters": None, "count": self.target}

    @property
    def finished(self) -> bool:
        return self._done

    def start(self, ctx: Context) -> dict[str, Any]:
        view = self.view(ctx)
        if view is None:
            step = Step("remove", {}, self.required, error="no leader answered")
            return self.finish(ctx, step, False)
        if len(voters(view)) <= self.target:
            self._done = True
            return {"idle": f"the group has {len(voters(view))} voters"}
        leader = int(view["node_id"])
        choices = [n for n in voters(view) if self.with_leader or n != leader]
        victim = ctx.rng.choice(choices)
        step = Step("remove", {"node": victim, "was_leader": victim == leader}, self.required)
        detail = self.finish(ctx, step, self.do_remove(ctx, victim, step))
        if not step.ok or len(voters(step.after)) <= self.target:
            self._done = True
        return detail


class RemoveLeader(_Membership):
    name = "remove-leader"
    doc = ("Remove the current leader (it hands leadership over first, the operation is "
           "retried on the new leader), `count` times (1); a spare is added first when the "
           "removal would leave fewer than `min_voters` (3) voters.")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.count = int(params.get("count", 1))
        self.min_voters = int(params.get("min_voters", 3))
        self.removals = 0
        self._failed = False

    @classmethod
    def spares_needed(cls, nodes: int, params: dict[str, Any]) -> int:
        count = int(params.get("count", 1))
        return max(0, count - max(0, nodes - int(params.get("min_voters", 3))))

    def intended(self, original: list[int], spares: list[int]) -> dict[str, Any]:
        # Each removal above min_voters shrinks the group by one; below it, a
        # spare was added first, so the count stays.
        removable = max(0, len(original) - self.min_voters)
        return {"voters": None, "count": len(original) - min(self.count, removable)}

    @property
    def finished(self) -> bool:
        return self._failed or self.removals >= self.count

    def start(self, ctx: Context) -> dict[str, Any]:
        if self.finished:
            return {"idle": f"{self.removals} leader(s) removed"}
        view = self.view(ctx)
        out: list[dict[str, Any]] = []
        if view is not None and len(voters(view)) - 1 < self.min_voters:
            spare = next(iter(self.pool(ctx)), None)
            step = Step("add", {"node": spare, "why": "keep min_voters"}, self.required)
            if spare is None:
                step.error = "no spare to keep min_voters"
                self._failed = True
                return self.finish(ctx, step, False)
            out += self.finish(ctx, step, self.do_add(ctx, spare, step))["membership"]
            if not step.ok:
                self._failed = True
                return {"membership": out}
        leader = self.leader(ctx)
        step = Step("remove-leader", {"node": leader}, self.required)
        if leader is None:
            step.error = "no leader answered"
            ok = False
        else:
            ok = self.do_remove(ctx, leader, step)
            new_leader = self.leader(ctx)
            step.checks["new_leader"] = new_leader
            if new_leader == leader:
                step.error = f"n{leader} still leads after its removal"
        out += self.finish(ctx, step, ok)["membership"]
        self.removals += 1 if step.ok else 0
        self._failed = self._failed or not step.ok
        return {"membership": out}


class WipeRepair(_Membership):
    name = "wipe-repair"
    needs = ("membership", "kill", "file")
    doc = ("Kill a pinned follower and wipe its data directory (mode=wipe) or damage its hard "
           "state so that `ledgermq node repair` must set the directory aside (mode=corrupt); "
           "on stop start it again, check it cannot vote (identity mismatch, never leader), "
           "then member rejoin and wait until it votes again under its new directory id. "
           "count (1) repairs.")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.for_churn = False  # set by Churn: its steps are reported, not required
        self.mode = str(params.get("mode", "wipe"))
        if self.mode not in ("wipe", "corrupt"):
            raise ValueError(f"wipe-repair: mode must be wipe or corrupt, not {self.mode!r}")
        self.count = int(params.get("count", 1))
        self._victim: tuple[int, int, Step] | None = None  # node, pinned directory id, step
        self._failed = False

    def intended(self, original: list[int], spares: list[int]) -> dict[str, Any]:
        return {"voters": original, "count": len(original)}

    @property
    def finished(self) -> bool:
        return self._victim is None and (self._failed or self.steps_done >= self.count)

    @property
    def broken(self) -> bool:
        """A node is down with its data wiped or damaged, waiting for `stop`."""
        return self._victim is not None

    def start(self, ctx: Context) -> dict[str, Any]:
        if self.finished:
            return {"idle": f"{self.steps_done} node(s) repaired"}
        return self.break_one(ctx)

    def stop(self, ctx: Context) -> dict[str, Any]:
        if self._victim is None:
            return {"nothing_to_undo": True}
        return self.repair(ctx)

    def break_one(self, ctx: Context) -> dict[str, Any]:
        """Kill a pinned follower and wipe (or damage) its data directory."""
        view, pinned = self.api(ctx).wait_view(
            lambda v: bool(_pinned_followers(v, ctx)), IDENTITY_TIMEOUT)
        step = Step("wipe" if self.mode == "wipe" else "repair", {},
                    self.required and not self.for_churn)
        if not pinned or view is None:
            step.error = ("no live follower with a pinned directory id within "
                          f"{IDENTITY_TIMEOUT:g}s: a wipe would not be detectable")
            self._failed = True
            return self.finish(ctx, step, False)
        node = ctx.rng.choice(_pinned_followers(view, ctx))
        row = member_row(view, node) or {}
        old_dir = int(row.get("directory_id") or 0)
        step.nodes = {"node": node, "pinned_directory_id": old_dir}
        ctx.backend.signal_node(node, signal.SIGKILL)
        ctx.backend.wait_node_exit(node, 10.0)
        if self.mode == "wipe":
            where = ctx.backend.set_aside_data(node, "wiped")
            step.checks["wiped"] = str(where) if where else None
        else:
            step.checks["damaged"] = _damage(ctx, node)
        self._victim = (node, old_dir, step)
        return {"node": node, "mode": self.mode, "pinned_directory_id": old_dir,
                **{k: v for k, v in step.checks.items()}}

    def repair(self, ctx: Context) -> dict[str, Any]:
        """Start it again, check it cannot vote, rejoin it, wait until it votes."""
        assert self._victim is not None
        node, old_dir, step = self._victim
        self._victim = None
        if self.mode == "corrupt":
            step.checks["refused_to_start"] = _refuses_to_start(ctx, node)
            step.checks["node_repair"] = _node_repair(ctx, node)
        restarted = self.restart(ctx, [node])
        if restarted["failed"]:
            step.error = f"n{node} did not come back after its repair"
            self._failed = True
            return self.finish(ctx, step, False)
        api = self.api(ctx)
        # Cannot vote: the leader hears a directory id other than the pinned one.
        view, flagged = api.wait_view(lambda v: bool((member_row(v, node) or {})
                                                     .get("identity_mismatch")),
                                      IDENTITY_TIMEOUT)
        row = member_row(view or {}, node) or {}
        step.checks.update({"identity_mismatch_seen": flagged,
                            "heard_directory_id": row.get("heard_directory_id"),
                            "leader_while_wiped": (view or {}).get("leader_id")})
        if not flagged:
            step.error = (f"the leader never flagged n{node}'s new data directory "
                          f"(pinned {old_dir}, heard {row.get('heard_directory_id')})")
        elif view is not None and int(view.get("leader_id") or 0) == node:
            step.error = f"wiped n{node} became leader before it rejoined"
        # The node's own word on its new directory id (`ledgermq node identity`).
        own_dir = _directory_id(ctx, node)
        step.checks["identity_directory_id"] = own_dir
        heard = int(row.get("heard_directory_id") or 0)
        if flagged and heard != own_dir:
            step.error = (f"the leader heard directory {heard} from n{node}, whose identity "
                          f"file says {own_dir}")
        new_dir = own_dir or heard
        # As an operator would: `member rejoin --node N` when `member list` flags the
        # new directory; when it does not (the leader has not heard from it), with
        # the directory id `node identity` printed, never the pinned one by default.
        body: dict[str, Any] = {"node_id": node}
        if not flagged and own_dir:
            body["directory_id"] = own_dir
        step.checks["rejoin_directory_id"] = body.get("directory_id", 0)
        rejoined = self.change(ctx, step, "rejoin", body,
                               lambda v: _votes_as(v, node, new_dir))
        if not rejoined.ok:
            self.complete_promotion(ctx, node, step)
        view = api.leader_view()
        step.after = view
        final = member_row(view or {}, node) or {}
        step.checks.update({"rejoined_directory_id": final.get("directory_id"),
                            "role_after": final.get("role")})
        ok = view is not None and new_dir not in (0, old_dir) and _votes_as(view, node, new_dir)
        detail = self.finish(ctx, step, ok)
        self._failed = self._failed or not step.ok
        return detail


def _pinned_followers(view: View, ctx: Context) -> list[int]:
    """Voters other than the leader, alive, pinned to a directory id."""
    leader = int(view.get("leader_id") or 0)
    out = []
    for row in view.get("members", []):
        node = int(row["node_id"])
        if (row.get("role") == "voter" and node != leader and int(row.get("directory_id") or 0)
                and not row.get("identity_mismatch") and ctx.backend.node_alive(node)):
            out.append(node)
    return sorted(out)


def _votes_as(view: View, node: int, directory_id: int) -> bool:
    """`node` is a voter pinned to `directory_id`, and the leader hears that id."""
    row = member_row(view, node) or {}
    return (node in voters(view) and directory_id != 0
            and int(row.get("directory_id") or 0) == directory_id
            and not row.get("identity_mismatch"))


def _directory_id(ctx: Context, node: int) -> int:
    """The directory id the node's IDENTITY file names (`ledgermq node identity`), 0
    when it cannot be read."""
    status, output = ctx.backend.run_on(node, [
        sys.executable, "-m", "ledgermq.cli", "node", "identity", "--data-dir",
        str(ctx.backend.data_dir(node)), "--output", "json"], timeout=60.0)
    if status != 0 or "{" not in output:
        return 0
    try:
        return int(json.loads(output[output.index("{"):output.rindex("}") + 1])
                   .get("directory_id") or 0)
    except (ValueError, TypeError):
        return 0


def _damage(ctx: Context, node: int) -> dict[str, Any]:
    """Flip bits in the node's hard state (CRC-checked: recovery refuses it)."""
    data = ctx.backend.data_dir(node)
    for name in ("hardstate", "IDENTITY"):
        path = data / name
        if path.is_file():
            offsets = disk_faults.flip_bits(path, 8, ctx.rng)
            return {"file": name, "offsets": offsets}
    return {"file": None}


def _refuses_to_start(ctx: Context, node: int) -> dict[str, Any]:
    """Start the damaged node: it must exit (refusing its data), not serve."""
    ctx.backend.start_node(node)
    ready = ctx.backend.wait_node(node, 30.0)
    if ready.ready:  # it served damaged data: stop it before the repair
        ctx.backend.stop_node(node)
    return {"refused": not ready.ready, "exit_status": ready.exit_status,
            "reason": ready.reason, "log_tail": list(ready.log_tail[-3:])}


def _node_repair(ctx: Context, node: int) -> dict[str, Any]:
    """`ledgermq node repair --data-dir D` where the node runs; the directory it
    set aside is moved under the run's `damaged/` (out of `data/`, kept)."""
    data = ctx.backend.data_dir(node)
    status, output = ctx.backend.run_on(node, [sys.executable, "-m", "ledgermq.cli", "node",
                                               "repair", "--data-dir", str(data)], timeout=60.0)
    kept = []
    for aside in sorted(data.parent.glob(f"{data.name}.damaged-*")):
        target = ctx.backend.out / "damaged" / ctx.backend.spec.group / aside.name
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            aside.rename(target)
            kept.append(str(target))
    return {"exit_status": status, "output": output[-2000:], "set_aside": kept}


class Churn(_Membership):
    name = "membership"
    needs = ("membership", "kill", "file")
    required = False
    doc = ("Random membership churn, one change per period among those the configuration "
           "allows: add a spare, remove a follower, remove the leader, replace a voter, "
           "wipe and repair a follower (min_voters 3, max_voters 5); mix with kill, "
           "partition... A learner left by a change cut short is promoted at the period's end.")

    ACTIONS = ("add", "remove", "remove-leader", "replace", "wipe-repair")
    # Faults around a churn step may stall it: give up sooner than a plan.
    change_timeout = 30.0

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.min_voters = int(params.get("min_voters", 3))
        self.max_voters = int(params.get("max_voters", 5))
        self._repair: WipeRepair | None = None

    @classmethod
    def spares_needed(cls, nodes: int, params: dict[str, Any]) -> int:
        return max(2, int(params.get("max_voters", 5)) - nodes)

    def choices(self, ctx: Context, view: View) -> list[str]:
        count = len(voters(view))
        pool = self.pool(ctx)
        out = []
        if count < self.max_voters and pool:
            out.append("add")
        if count > self.min_voters:
            out += ["remove", "remove-leader"]
        if pool:
            out.append("replace")
        if _pinned_followers(view, ctx):
            out.append("wipe-repair")
        return out

    def start(self, ctx: Context) -> dict[str, Any]:
        detail = self.one_change(ctx)
        for step in detail.get("membership", []):
            step["required"] = False  # churn: reported, never a plan step
        return detail

    def one_change(self, ctx: Context) -> dict[str, Any]:
        view = self.view(ctx)
        if view is None:
            step = Step("churn", {}, False, error="no leader answered")
            return self.finish(ctx, step, False)
        self.sync(ctx, view)
        choices = self.choices(ctx, view)
        if not choices:
            return {"idle": "no change possible"}
        action = ctx.rng.choice(choices)
        leader = int(view["node_id"])
        followers = [n for n in voters(view) if n != leader]
        if action == "add":
            node = ctx.rng.choice(self.pool(ctx))
            step = Step("add", {"node": node}, False)
            return self.finish(ctx, step, self.do_add(ctx, node, step))
        if action == "remove":
            node = ctx.rng.choice(followers)
            step = Step("remove", {"node": node}, False)
            return self.finish(ctx, step, self.do_remove(ctx, node, step))
        if action == "remove-leader":
            step = Step("remove-leader", {"node": leader}, False)
            return self.finish(ctx, step, self.do_remove(ctx, leader, step))
        if action == "replace":
            old = ctx.rng.choice(voters(view))
            new = ctx.rng.choice(self.pool(ctx))
            step = Step("replace", {"old": old, "new": new, "old_was_leader": old == leader},
                        False)
            return self.finish(ctx, step, self.do_replace(ctx, old, new, step))
        # Wipe now; the node comes back, is checked and rejoins at the period's
        # end, once the period's other faults are healed (like `wipe-repair`).
        self._repair = WipeRepair(mode="wipe")
        self._repair.for_churn = True
        self._repair.use_api(self.api(ctx))
        return self._repair.break_one(ctx)

    def stop(self, ctx: Context) -> dict[str, Any]:
        """Repair the node wiped this period; then what a change cut short left
        behind: promote a learner, rejoin a member that answers from a new
        data directory (a wipe whose repair did not get through)."""
        out: list[dict[str, Any]] = []
        repair, self._repair = self._repair, None
        if repair is not None and repair.broken:
            out += repair.repair(ctx).get("membership", [])
        view = self.api(ctx).leader_view()
        left = learners(view)
        if left:
            step = Step("promote", {"nodes": left}, False)
            for node in left:
                self.complete_promotion(ctx, node, step)
            out += self.finish(ctx, step, not learners(step.after or
                                                       self.api(ctx).leader_view()))["membership"]
        view = self.api(ctx).leader_view()
        for row in (view or {}).get("members", []):
            if not row.get("identity_mismatch"):
                continue
            node = int(row["node_id"])
            heard = int(row.get("heard_directory_id") or 0)
            step = Step("rejoin", {"node": node, "heard_directory_id": heard}, False)
            self.change(ctx, step, "rejoin", {"node_id": node},
                        lambda v, n=node, d=heard: _votes_as(v, n, d))
            after = self.api(ctx).leader_view()
            out += self.finish(ctx, step, after is not None and _votes_as(after, node,
                                                                          heard))["membership"]
        for step_json in out:
            step_json["required"] = False
        return {"membership": out} if out else {"nothing_to_undo": True}


REGISTRY: dict[str, type[_Membership]] = {cls.name: cls for cls in (
    ReplaceEach, Grow, Shrink, RemoveLeader, WipeRepair, Churn)}


def spares_for(nemeses: list[Nemesis], nodes: int) -> int:
    """The spares a run needs for its membership nemeses."""
    return max((n.spares_needed(nodes, n.params) for n in nemeses
                if isinstance(n, _Membership)), default=0)


def intention(nemeses: list[Nemesis], original: list[int],
              spares: list[int]) -> dict[str, Any] | None:
    """The configuration the run intends at its end: the one plan nemesis's, None
    with several plans or with churn (then only consistency is checked)."""
    plans = [n for n in nemeses if isinstance(n, _Membership) and n.required]
    if len(plans) != 1 or any(isinstance(n, Churn) for n in nemeses):
        return None
    return plans[0].intended(original, spares)

