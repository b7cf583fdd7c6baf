"""Nemeses: named faults with parameters, each a `start` and a `stop`.

A nemesis acts through a `Backend` and returns a small JSON-ready detail of
what it did (which nodes, which links), recorded in the history so plots and
readers see exactly what was broken. `stop` undoes its own fault (heal,
restart, resume, reset the clock). Nemeses compose: a run may list several,
and the schedule starts and stops them together or in random subsets.

Targets are drawn from the run's seeded random generator; "leader" nemeses
ask the nodes who leads at the moment they strike.

A node a nemesis restarts must come back: alive and answering PING
(`Backend.wait_node`). One that does not is listed under `failed` with its
exit status and last log lines. Every attempt is kept in `Context.restarts`
and judged by chaos.node_report: a failure makes the run invalid unless the
nemesis was told `may_stay_down=1` (a node that rightly refuses damaged
data, e.g. after `bitflip`); then it is still reported, as allowed.
"""

from __future__ import annotations

import abc
import random
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from chaos import disk_faults
from chaos.backend import Backend


@dataclass
class Context:
    backend: Backend
    rng: random.Random
    leader: Callable[[], int | None]  # the current ready leader, asked of the nodes
    log: Callable[[str], None] = print
    restart_timeout: float = 60.0
    # Every restart a nemesis attempted (_Restarting.restart), in order, with
    # whether the node came back; chaos.node_report judges them.
    restarts: list[dict[str, Any]] = field(default_factory=list)


class Nemesis(abc.ABC):
    name: ClassVar[str]
    needs: ClassVar[tuple[str, ...]]
    doc: ClassVar[str]

    def __init__(self, **params: Any) -> None:
        self.params = params

    @abc.abstractmethod
    def start(self, ctx: Context) -> dict[str, Any]:
        """Inject the fault; returns what was done (recorded in the history)."""

    @abc.abstractmethod
    def stop(self, ctx: Context) -> dict[str, Any]:
        """Heal the fault; returns what was done."""

    # Stopped after the other nemeses of a period (their faults healed first):
    # the membership nemeses, whose period end repairs and reconciles.
    stop_last: ClassVar[bool] = False

    @property
    def finished(self) -> bool:
        """Whether a nemesis with a plan has carried all of it out (the membership
        nemeses: replace every node, grow to five...); a fault never is. A run
        whose nemeses are all finished stops its fault phase early."""
        return False

    @property
    def plan_unfinished(self) -> bool:
        """A plan that must be carried out whole (the membership plan nemeses)
        and is not yet: the schedule runs on past its time limit for it."""
        return False


def _cut_between(ctx: Context, side_a: list[int], side_b: list[int]) -> None:
    for a in side_a:
        for b in side_b:
            ctx.backend.drop(a, b)
            ctx.backend.drop(b, a)


def _pick_leader(ctx: Context) -> int:
    leader = ctx.leader()
    return leader if leader is not None else ctx.rng.choice(ctx.backend.node_ids)


class _Network(Nemesis):
    needs = ("partition",)

    def stop(self, ctx: Context) -> dict[str, Any]:
        ctx.backend.heal()
        return {"healed": True}


class PartitionHalves(_Network):
    name = "partition-halves"
    doc = "Shuffle the nodes and cut them into a minority and a majority (both directions)."

    def start(self, ctx: Context) -> dict[str, Any]:
        nodes = ctx.backend.node_ids[:]
        ctx.rng.shuffle(nodes)
        half = len(nodes) // 2
        minority, majority = sorted(nodes[:half]), sorted(nodes[half:])
        _cut_between(ctx, minority, majority)
        return {"minority": minority, "majority": majority}


class PartitionLeader(_Network):
    name = "partition-leader"
    doc = "Isolate the current leader from every other node."

    def start(self, ctx: Context) -> dict[str, Any]:
        leader = _pick_leader(ctx)
        others = [n for n in ctx.backend.node_ids if n != leader]
        _cut_between(ctx, [leader], others)
        return {"isolated": leader}


class MajoritiesRing(_Network):
    name = "partition-ring"
    doc = ("Majorities ring: every node sees a majority, no two see the same one "
           "(5 nodes: each keeps only its two ring neighbours; 3 nodes: one link cut).")

    def start(self, ctx: Context) -> dict[str, Any]:
        nodes = ctx.backend.node_ids[:]
        ctx.rng.shuffle(nodes)
        n = len(nodes)
        majority = n // 2 + 1
        reach = majority // 2  # neighbours kept on each side of the ring
        cut: list[list[int]] = []
        for i, a in enumerate(nodes):
            for j, b in enumerate(nodes):
                distance = min((i - j) % n, (j - i) % n)
                if a < b and distance > reach:
                    cut.append([a, b])
        if not cut:  # 3 nodes: a full ring is every link, so cut one
            cut.append(sorted(nodes[:2]))
        for a, b in cut:
            ctx.backend.drop(a, b)
            ctx.backend.drop(b, a)
        return {"ring": nodes, "cut": cut}


class Bridge(_Network):
    name = "partition-bridge"
    doc = "Two halves that cannot talk, and one bridge node that talks to both."

    def start(self, ctx: Context) -> dict[str, Any]:
        nodes = ctx.backend.node_ids[:]
        ctx.rng.shuffle(nodes)
        bridge, rest = nodes[0], nodes[1:]
        half = len(rest) // 2
        a, b = sorted(rest[:half]), sorted(rest[half:])
        _cut_between(ctx, a, b)
        return {"bridge": bridge, "sides": [a, b]}


class OneWay(_Network):
    name = "partition-one-way"
    doc = "A random node's packets to every other node are dropped; it still hears them."

    def start(self, ctx: Context) -> dict[str, Any]:
        node = ctx.rng.choice(ctx.backend.node_ids)
        for other in ctx.backend.node_ids:
            if other != node:
                ctx.backend.drop(node, other)
        return {"mute": node}


class Loss(Nemesis):
    name = "loss"
    needs = ("loss",)
    doc = "Drop packets at random on every link between nodes (param probability, 0.3)."

    def start(self, ctx: Context) -> dict[str, Any]:
        p = float(self.params.get("probability", 0.3))
        for a in ctx.backend.node_ids:
            for b in ctx.backend.node_ids:
                if a != b:
                    ctx.backend.drop(a, b, probability=p)
        return {"probability": p}

    def stop(self, ctx: Context) -> dict[str, Any]:
        ctx.backend.heal()
        return {"healed": True}


class Delay(Nemesis):
    name = "delay"
    needs = ("delay",)
    doc = ("Delay every link between nodes (params delay_ms 100, jitter_ms 50, "
           "rate_bytes_s 0 = unlimited) through the userspace link proxy.")

    def start(self, ctx: Context) -> dict[str, Any]:
        delay = float(self.params.get("delay_ms", 100))
        jitter = float(self.params.get("jitter_ms", 50))
        rate = float(self.params.get("rate_bytes_s", 0))
        for a in ctx.backend.node_ids:
            for b in ctx.backend.node_ids:
                if a != b:
                    ctx.backend.shape(a, b, delay, jitter, rate)
        return {"delay_ms": delay, "jitter_ms": jitter, "rate_bytes_s": rate}

    def stop(self, ctx: Context) -> dict[str, Any]:
        ctx.backend.heal()
        return {"healed": True}


_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")


class _Restarting(Nemesis):
    """A nemesis that stops nodes and restarts them on `stop`.

    Param `may_stay_down` (0 by default): 1 says the run expects that a
    restart may fail (the node refusing damaged files); the failure is
    still reported, but does not make the run invalid.
    """

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        flag = str(params.get("may_stay_down", "0")).lower()
        if flag not in _TRUE + _FALSE:
            raise ValueError(f"{self.name}: may_stay_down must be 0 or 1, not {flag!r}")
        self.may_stay_down = flag in _TRUE

    def restart(self, ctx: Context, nodes: list[int]) -> dict[str, Any]:
        """Start every dead node of `nodes`, then wait for each to answer.

        A node a membership change took out of the group meanwhile is not
        restarted (it is gone: its data set aside, chaos.membership)."""
        gone = [n for n in nodes if n in ctx.backend.removed]
        nodes = [n for n in nodes if n not in gone]
        for node in nodes:
            if not ctx.backend.node_alive(node):
                ctx.backend.start_node(node)
        started, failed, failures = [], [], []
        for node in nodes:
            ready = ctx.backend.wait_node(node, ctx.restart_timeout)
            attempt = {**ready.as_dict(), "node": node, "nemesis": self.name,
                       "allowed": self.may_stay_down}
            ctx.restarts.append(attempt)
            if ready.ready:
                started.append(node)
                continue
            failed.append(node)
            failures.append(attempt)
            ctx.log(f"chaos: node {node} did not come back after {self.name}: {ready.reason}"
                    + (" (allowed: may_stay_down)" if self.may_stay_down else ""))
        detail: dict[str, Any] = {"restarted": started, "failed": failed}
        if gone:
            detail["not_restarted_removed"] = gone
        if failures:
            detail["failures"] = failures
        return detail


def _kill(ctx: Context, nodes: list[int]) -> None:
    for node in nodes:
        ctx.backend.signal_node(node, signal.SIGKILL)
    for node in nodes:
        ctx.backend.wait_node_exit(node, 10.0)


@dataclass
class _Targets:
    nodes: list[int] = field(default_factory=list)


class Kill(_Restarting):
    name = "kill"
    needs = ("kill",)
    doc = ("kill -9 a random node; restart it on stop (may_stay_down=1: a failed restart "
           "is allowed).")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._down = _Targets()

    def targets(self, ctx: Context) -> list[int]:
        return [ctx.rng.choice(ctx.backend.node_ids)]

    def start(self, ctx: Context) -> dict[str, Any]:
        self._down.nodes = self.targets(ctx)
        _kill(ctx, self._down.nodes)
        return {"killed": self._down.nodes}

    def stop(self, ctx: Context) -> dict[str, Any]:
        nodes, self._down.nodes = self._down.nodes, []
        return self.restart(ctx, nodes)


class KillLeader(Kill):
    name = "kill-leader"
    doc = ("kill -9 the current leader; restart it on stop (may_stay_down=1: a failed restart "
           "is allowed).")

    def targets(self, ctx: Context) -> list[int]:
        return [_pick_leader(ctx)]


class Pause(Nemesis):
    name = "pause"
    needs = ("pause",)
    doc = "SIGSTOP a random node; SIGCONT on stop."

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._paused: list[int] = []

    def targets(self, ctx: Context) -> list[int]:
        return [ctx.rng.choice(ctx.backend.node_ids)]

    def start(self, ctx: Context) -> dict[str, Any]:
        self._paused = self.targets(ctx)
        for node in self._paused:
            ctx.backend.signal_node(node, signal.SIGSTOP)
        return {"paused": self._paused}

    def stop(self, ctx: Context) -> dict[str, Any]:
        nodes, self._paused = self._paused, []
        for node in nodes:
            ctx.backend.signal_node(node, signal.SIGCONT)
        return {"resumed": nodes}


class PauseLeader(Pause):
    name = "pause-leader"
    doc = "SIGSTOP the current leader; SIGCONT on stop."

    def targets(self, ctx: Context) -> list[int]:
        return [_pick_leader(ctx)]


class PowerLoss(_Restarting):
    name = "power-loss"
    needs = ("kill", "power-loss")
    doc = ("kill -9 nodes and drop every write they had not fsynced (durability trace), "
           "optionally leaving a torn tail; restart on stop. Params: targets "
           "one|minority|majority|all (default majority), torn_tail bytes (default 0), "
           "may_stay_down 0|1.")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._down: list[int] = []

    def start(self, ctx: Context) -> dict[str, Any]:
        nodes = ctx.backend.node_ids[:]
        ctx.rng.shuffle(nodes)
        which = str(self.params.get("targets", "majority"))
        count = {"one": 1, "minority": (len(nodes) - 1) // 2,
                 "majority": len(nodes) // 2 + 1, "all": len(nodes)}[which]
        self._down = sorted(nodes[:max(count, 1)])
        _kill(ctx, self._down)
        torn = int(self.params.get("torn_tail", 0))
        dropped = {}
        for node in self._down:
            report = disk_faults.power_cut(ctx.backend.data_dir(node), torn_tail=torn,
                                           rng=ctx.rng)
            dropped[node] = report.bytes_dropped
        return {"nodes": self._down, "bytes_dropped": dropped, "torn_tail": torn}

    def stop(self, ctx: Context) -> dict[str, Any]:
        nodes, self._down = self._down, []
        return self.restart(ctx, nodes)


class _FileFault(_Restarting):
    """Damage files of one node (the same node every time: always a minority)."""

    needs = ("kill", "file")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._victim: int | None = None
        self._down: list[int] = []

    @abc.abstractmethod
    def damage(self, ctx: Context, node: int) -> dict[str, Any]:
        """Damage the (stopped) node's files; returns what was changed."""

    def start(self, ctx: Context) -> dict[str, Any]:
        if self._victim is None:
            self._victim = ctx.rng.choice(ctx.backend.node_ids)
        node = self._victim
        _kill(ctx, [node])
        self._down = [node]
        return {"node": node, **self.damage(ctx, node)}

    def stop(self, ctx: Context) -> dict[str, Any]:
        nodes, self._down = self._down, []
        return self.restart(ctx, nodes)


class Truncate(_FileFault):
    name = "truncate"
    doc = ("Kill one node (always the same: a minority), cut the last N bytes of its newest "
           "CommitLog segment (param bytes, default 4096), restart on stop (may_stay_down=1: a "
           "failed restart is allowed).")

    def damage(self, ctx: Context, node: int) -> dict[str, Any]:
        segments = disk_faults.segment_files(ctx.backend.data_dir(node))
        if not segments:
            return {"file": None}
        cut = disk_faults.truncate_tail(segments[-1], int(self.params.get("bytes", 4096)))
        return {"file": segments[-1].name, "bytes_cut": cut}


class Bitflip(_FileFault):
    name = "bitflip"
    doc = ("Kill one node (always the same: a minority), flip random bits in its newest "
           "CommitLog segment (param bits, default 8; param file: a path in the data "
           "directory instead, e.g. hardstate), restart on stop (may_stay_down=1: a failed "
           "restart is allowed).")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.target = str(params.get("file", "segment"))
        if ".." in Path(self.target).parts or Path(self.target).is_absolute():
            raise ValueError(f"bitflip: file {self.target!r} must be a path inside the data dir")

    def damage(self, ctx: Context, node: int) -> dict[str, Any]:
        data_dir = ctx.backend.data_dir(node)
        path: Path | None
        if self.target == "segment":
            segments = disk_faults.segment_files(data_dir)
            path = segments[-1] if segments else None
        else:
            path = data_dir / self.target
            if not path.is_file():
                path = None
        if path is None:
            return {"file": None}
        offsets = disk_faults.flip_bits(path, int(self.params.get("bits", 8)), ctx.rng)
        return {"file": str(path.relative_to(data_dir)), "offsets": offsets}


class ClockSkew(Nemesis):
    name = "clock-skew"
    needs = ("clock",)
    doc = ("Shift each node's wall clock by a random offset up to ±max_s (default 300 s) "
           "with libfaketime; monotonic time untouched. Reset on stop.")

    def start(self, ctx: Context) -> dict[str, Any]:
        limit = float(self.params.get("max_s", 300))
        offsets = {}
        for node in ctx.backend.node_ids:
            offsets[node] = round(ctx.rng.uniform(-limit, limit), 3)
            ctx.backend.set_clock_offset(node, offsets[node])
        return {"offsets": offsets}

    def stop(self, ctx: Context) -> dict[str, Any]:
        for node in ctx.backend.node_ids:
            ctx.backend.set_clock_offset(node, 0.0)
        return {"reset": True}


REGISTRY: dict[str, type[Nemesis]] = {cls.name: cls for cls in (
    PartitionHalves, PartitionLeader, MajoritiesRing, Bridge, OneWay, Loss, Delay, Kill,
    KillLeader, Pause, PauseLeader, PowerLoss, Truncate, Bitflip, ClockSkew)}


def parse(spec: str, registry: Mapping[str, type[Nemesis]] | None = None) -> list[Nemesis]:
    """'kill-leader,loss:probability=0.5' -> nemesis instances (comma separated,
    parameters after a colon as key=value pairs joined by '+'); `registry`:
    the names known (default: the faults of this module)."""
    registry = REGISTRY if registry is None else registry
    out: list[Nemesis] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, raw = part.partition(":")
        if name not in registry:
            raise ValueError(f"unknown nemesis {name!r}; known: {', '.join(sorted(registry))}")
        params: dict[str, Any] = {}
        for item in filter(None, raw.split("+")):
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"nemesis parameter {item!r} must be key=value")
            params[key] = value
        out.append(registry[name](**params))
    return out


def needs(nemeses: list[Nemesis]) -> set[str]:
    return {need for n in nemeses for need in n.needs}
