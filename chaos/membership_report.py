"""What a run's membership changes did: every step with its availability gap,
and whether the group ended in the configuration intended.

**The gap of a step** is the longest window without an acknowledged send
that overlaps the step, read from the client history alone: the step's
window is from when the harness began it to when it ended (its wall-clock
`started_ns`/`finished_ns`, the history's clock) plus `SETTLE_S`, since a
change may disturb clients just after the leader answered (a new leader
finishing its first entry, routes moving); every interval between two
consecutive acknowledgements (or between the first or last send invoked and
the nearest acknowledgement) that overlaps that window counts, and the
longest is the gap. So a gap includes the ordinary spacing of
acknowledgements (tens of milliseconds at the harness's rates): a step that
disturbed nothing has a gap of about that. Each CONFIG entry a step
committed gets its own gap over its own window (the broker reports how long
each took; they are laid end to end from the attempt's start).

**The final check** (`problems`) makes the run invalid when: a plan step
failed; no leader answered at the end; the configuration is still pending or
has a learner left; the group's members differ from what the harness
believed (the nodes it expected up and converged); the intended voters (or
their count) were not reached; a wiped node was never flagged by the leader
(so it might have voted) or led before it rejoined; the NameServer's route
for the topic, read after the drain, lists a node outside the final
configuration (the drain must read from the final members); or the operator's
view (`ledgermq member list --json` through the NameServer's admin app)
disagrees with the leader's.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from chaos.history import Op
from chaos.stats import NS, run_start_ns

SETTLE_S = 1.0


def membership_steps(ops: Sequence[Op]) -> list[dict[str, Any]]:
    """Every membership step the nemeses recorded, in order."""
    steps = []
    for op in ops:
        if not op.is_nemesis or op.type != "info" or not isinstance(op.value, dict):
            continue
        detail = op.value.get("detail")
        if isinstance(detail, dict) and isinstance(detail.get("membership"), list):
            for step in detail["membership"]:
                steps.append({"nemesis": op.value.get("nemesis"), **step})
    return steps


class AckTimeline:
    """The acknowledged sends of a history, for gap queries."""

    def __init__(self, ops: Sequence[Op]) -> None:
        sends = [op for op in ops if not op.is_nemesis and op.f == "send"]
        invokes = [op.time_ns for op in sends if op.type == "invoke"]
        self.t0 = run_start_ns(ops)
        self.first = min(invokes, default=0)
        self.last = max(invokes, default=0)
        acks = sorted(op.time_ns for op in sends if op.type == "ok")
        self.marks = [self.first, *[a for a in acks if self.first <= a <= self.last], self.last]

    def gap(self, start_ns: int, end_ns: int) -> dict[str, Any]:
        """The longest interval without an acknowledgement overlapping [start, end]."""
        if not self.first or end_ns < self.first or start_ns > self.last:
            return {"gap_s": None, "from_s": None, "to_s": None, "outside_load": True}
        marks = self.marks
        # The interval around `start` begins at the last mark at or before it.
        i = max(0, bisect.bisect_right(marks, start_ns) - 1)
        best = (0, marks[i], marks[i])
        while i + 1 < len(marks) and marks[i] <= end_ns:
            length = marks[i + 1] - marks[i]
            if length > best[0]:
                best = (length, marks[i], marks[i + 1])
            i += 1
        return {"gap_s": round(best[0] / NS, 3), "from_s": round((best[1] - self.t0) / NS, 3),
                "to_s": round((best[2] - self.t0) / NS, 3)}


def step_gaps(ops: Sequence[Op], settle_s: float = SETTLE_S) -> list[dict[str, Any]]:
    """Each step with its gap and each of its CONFIG entries' gaps."""
    timeline = AckTimeline(ops)
    settle = int(settle_s * NS)
    out = []
    for step in membership_steps(ops):
        start, end = int(step["started_ns"]), int(step["finished_ns"])
        entries = []
        for change in step.get("changes", []):
            for entry in change.get("steps", []):
                gap = timeline.gap(int(entry["started_ns"]), int(entry["finished_ns"]) + settle)
                entries.append({"operation": change.get("action"), "action": entry["action"],
                                "node_id": entry["node_id"], "index": entry["index"],
                                "seconds": entry["seconds"], "gap_s": gap["gap_s"]})
        gap = timeline.gap(start, end + settle)
        out.append({
            "nemesis": step.get("nemesis"), "step": step["step"], "nodes": step["nodes"],
            "required": step["required"], "ok": step["ok"], "error": step.get("error"),
            "started_s": round((start - timeline.t0) / NS, 3),
            "seconds": round((end - start) / NS, 3),
            "gap_s": gap["gap_s"], "gap_from_s": gap["from_s"], "gap_to_s": gap["to_s"],
            "entries": entries,
            "operations": [{"action": c.get("action"), "ok": c.get("ok"),
                            "attempts": c.get("attempt_count", len(c.get("attempts", []))),
                            "already_done": c.get("already_done"), "error": c.get("error")}
                           for c in step.get("changes", [])],
            "checks": step.get("checks", {}),
            "configuration": step.get("configuration"),
        })
    return out


def final_problems(steps: list[dict[str, Any]], final: dict[str, Any] | None,
                   believed: list[int], intended: dict[str, Any] | None,
                   route_nodes: list[int] | None, cli: dict[str, Any] | None) -> list[str]:
    """Why the membership part of a run is not valid (empty: it is)."""
    problems = []
    for step in steps:
        if step["required"] and not step["ok"]:
            problems.append(f"membership step {step['step']} {step['nodes']} failed: "
                            f"{step.get('error') or 'see its operations'}")
        if step["required"] and step.get("checks", {}).get("identity_mismatch_seen") is False:
            problems.append(f"wiped node {step['nodes'].get('node')} was never flagged "
                                "by the leader (identity mismatch): it might have voted")
    if final is None:
        problems.append("no leader answered the final membership query")
        return problems
    voters, learners = sorted(final["voters"]), sorted(final["learners"])
    if final.get("pending"):
        problems.append(f"the final configuration (index {final.get('index')}) is not committed")
    if learners:
        problems.append(f"learners left in the final configuration: {learners}")
    if sorted(set(voters) | set(learners)) != sorted(believed):
        problems.append(f"the group's members {sorted(set(voters) | set(learners))} differ "
                        f"from the harness's view {sorted(believed)}")
    if intended is not None:
        if intended.get("voters") is not None and voters != sorted(intended["voters"]):
            problems.append(f"final voters {voters}, intended {sorted(intended['voters'])}")
        if intended.get("count") is not None and len(voters) != intended["count"]:
            problems.append(f"{len(voters)} final voters, intended {intended['count']}")
    if route_nodes is None:
        problems.append("the NameServer's route for the topic could not be read after the drain")
    elif set(route_nodes) - set(voters) - set(learners):
        problems.append(f"the route read after the drain lists nodes "
                        f"{sorted(set(route_nodes) - set(voters) - set(learners))} outside "
                        f"the final configuration {voters}")
    if cli is not None and cli.get("configuration") is not None:
        seen = cli["configuration"]
        if (sorted(seen.get("voters", [])), sorted(seen.get("learners", []))) != (voters,
                                                                                 learners):
            problems.append(f"`ledgermq member list` through the NameServer shows voters "
                            f"{seen.get('voters')} learners {seen.get('learners')}, the "
                            f"leader {voters} {learners}")
    elif cli is not None:
        problems.append(f"`ledgermq member list` through the NameServer failed: "
                        f"{cli.get('error')}")
    return problems


def summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Per step kind: how many, how many succeeded, the longest gap."""
    kinds: dict[str, dict[str, Any]] = {}
    for step in steps:
        row = kinds.setdefault(step["step"], {"steps": 0, "ok": 0, "longest_gap_s": 0.0})
        row["steps"] += 1
        row["ok"] += bool(step["ok"])
        if step["gap_s"] is not None:
            row["longest_gap_s"] = max(row["longest_gap_s"], step["gap_s"])
    return kinds
