"""Performance over time: latency points, throughput, fault windows, unavailability.

Everything here is derived from the history alone, so a report can be rebuilt
from a history file long after the run.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from chaos.history import Op, pairs

NS = 1_000_000_000


@dataclass
class LatencyPoint:
    t: float  # seconds since the run started (invoke time)
    latency_ms: float
    type: str  # ok / fail / info
    f: str


@dataclass
class FaultWindow:
    name: str
    start: float
    end: float | None  # None: still active when the history ended
    detail: Any = None


@dataclass
class Gap:
    """A period without any acknowledged send."""

    start: float
    end: float
    seconds: float
    faults: list[str]


def run_start_ns(ops: Sequence[Op]) -> int:
    return min((op.time_ns for op in ops), default=0)


def latencies(ops: Sequence[Op], f: str = "send") -> list[LatencyPoint]:
    t0 = run_start_ns(ops)
    points = []
    for invoke, done in pairs(op for op in ops if not op.is_nemesis and op.f == f):
        if done is None:
            continue
        points.append(LatencyPoint((invoke.time_ns - t0) / NS,
                                   (done.time_ns - invoke.time_ns) / 1e6, done.type, f))
    return points


def throughput(ops: Sequence[Op], f: str = "send", bucket_s: float = 1.0
               ) -> dict[str, list[tuple[float, float]]]:
    """Per completion type, (bucket start s, ops per second) series."""
    t0 = run_start_ns(ops)
    end = max((op.time_ns for op in ops), default=t0)
    buckets = int((end - t0) / NS / bucket_s) + 1
    series: dict[str, list[int]] = {}
    for op in ops:
        if op.is_nemesis or op.f != f or op.type == "invoke":
            continue
        if f == "poll":
            weight = len((op.value or {}).get("messages", [])) if isinstance(op.value, dict) \
                else 1
        else:
            weight = 1
        row = series.setdefault(op.type, [0] * buckets)
        row[min(int((op.time_ns - t0) / NS / bucket_s), buckets - 1)] += weight
    return {k: [(i * bucket_s, n / bucket_s) for i, n in enumerate(v)] for k, v in series.items()}


def fault_windows(ops: Sequence[Op]) -> list[FaultWindow]:
    """Nemesis start/stop pairs (matched by nemesis name), as windows in run seconds."""
    t0 = run_start_ns(ops)
    open_: dict[str, FaultWindow] = {}
    windows: list[FaultWindow] = []
    for op in ops:
        if not op.is_nemesis or op.type != "info" or not isinstance(op.value, dict):
            continue
        name = str(op.value.get("nemesis", "?"))
        t = (op.time_ns - t0) / NS
        if op.f == "start":
            window = FaultWindow(name, t, None, op.value.get("detail"))
            open_[name] = window
            windows.append(window)
        elif op.f == "stop" and name in open_:
            open_.pop(name).end = t
    return windows


def unavailability(ops: Sequence[Op], min_gap_s: float = 1.0) -> dict[str, Any]:
    """Gaps between acknowledged sends longer than `min_gap_s`, tied to the faults they overlap.

    Only counted while sends were being attempted (between the first and the
    last send invoke), so a quiet phase is not mistaken for an outage.
    """
    t0 = run_start_ns(ops)
    sends = [op for op in ops if not op.is_nemesis and op.f == "send"]
    invokes = [op.time_ns for op in sends if op.type == "invoke"]
    acks = sorted((op.time_ns - t0) / NS for op in sends if op.type == "ok")
    windows = fault_windows(ops)
    if not invokes:
        return {"gaps": [], "longest_s": 0.0, "total_s": 0.0, "per_fault": []}
    first, last = (min(invokes) - t0) / NS, (max(invokes) - t0) / NS
    marks = [first, *[a for a in acks if first <= a <= last], last]
    gaps = []
    for a, b in itertools.pairwise(marks):
        if b - a >= min_gap_s:
            faults = [w.name for w in windows
                      if w.start <= b and (w.end is None or w.end >= a)]
            gaps.append(Gap(round(a, 3), round(b, 3), round(b - a, 3), faults))
    per_fault = []
    for w in windows:
        end = w.end if w.end is not None else last
        overlapping = [g for g in gaps if g.start <= end and g.end >= w.start]
        per_fault.append({"nemesis": w.name, "start": round(w.start, 3),
                          "end": None if w.end is None else round(w.end, 3),
                          "unavailable_s": round(max((g.seconds for g in overlapping),
                                                     default=0.0), 3)})
    return {"gaps": [asdict(g) for g in gaps],
            "longest_s": max((g.seconds for g in gaps), default=0.0),
            "total_s": round(sum(g.seconds for g in gaps), 3),
            "per_fault": per_fault}


def latency_summary(points: Sequence[LatencyPoint]) -> dict[str, Any]:
    ok = sorted(p.latency_ms for p in points if p.type == "ok")
    if not ok:
        return {"count": 0}

    def q(p: float) -> float:
        return round(ok[min(len(ok) - 1, int(p * len(ok)))], 3)

    return {"count": len(ok), "mean_ms": round(statistics.fmean(ok), 3), "p50_ms": q(0.5),
            "p95_ms": q(0.95), "p99_ms": q(0.99), "max_ms": round(ok[-1], 3)}
