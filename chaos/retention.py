"""Chaos runs with retention on: the brokers' settings, and the evidence that
retention really deleted data while the faults ran.

`RetentionSpec` is what `ledgermq chaos run --retention-bytes N` and the
matrix's `--retention` cells give every node: small CommitLog segments, a
small `retention_bytes`, a short `retention_interval_ms` and a small snapshot
interval (retention never deletes past the newest snapshot), so that whole
segments go every few seconds of the run and a node that is down for a fault
period comes back behind the leader's first index and must rejoin by a
snapshot install.

`RetentionMonitor` asks every node for BROKER_STATUS once a second for the
whole run and keeps, per node, how its `first_index` moved and how many
snapshots it wrote and installs it sent and received. The runtime's counters
restart at zero with the process, so a counter that goes down is a restart:
the monitor adds up each process's last figure. After the run,
`disk_evidence` lists each node's CommitLog segment files (named by their
start positions on a grid of `segment_size_bytes`, so the first one's base
over the segment size is the number of segments that node no longer has:
deleted by retention or replaced by an install).

`summarize` turns both into the `retention` section of results.json, and
`retention_problems` says why a retention run does not show what it was
asked to show (no segment deleted anywhere: the run did not exercise
retention, and its "0 lost" would prove nothing about it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos.disk_faults import segment_files

StatusFn = Callable[[str], Awaitable[dict[str, Any] | None]]

# Counters of BROKER_STATUS summed over a node's processes (each restart
# starts them at zero again).
COUNTERS = ("installs_received", "installs_sent", "install_failures",
            "install_bytes_received")


@dataclass(frozen=True)
class RetentionSpec:
    """Retention settings for every node of a chaos run.

    The defaults keep about 64 KiB of log per node (two 32 KiB segments)
    and write a snapshot every 16 KiB of log: at the matrix's 100 sends/s
    (~150 bytes of log each) a segment fills in about two seconds, the oldest
    goes within a second of that, and a node down for a 10 s fault period
    comes back several segments behind the leader's first index.
    """

    retention_bytes: int = 64 << 10
    segment_size_bytes: int = 32 << 10
    retention_interval_ms: int = 500
    snapshot_interval_bytes: int = 16 << 10
    snapshot_interval_entries: int = 200

    def __post_init__(self) -> None:
        if self.retention_bytes <= 0:
            raise ValueError("retention_bytes must be positive (0 means retention off)")
        if self.segment_size_bytes < 4096:
            raise ValueError("segment_size_bytes must be at least 4096")
        if self.retention_interval_ms < 1:
            raise ValueError("retention_interval_ms must be at least 1")
        if self.snapshot_interval_bytes < 0 or self.snapshot_interval_entries < 0:
            raise ValueError("snapshot intervals must not be negative")
        if not (self.snapshot_interval_bytes or self.snapshot_interval_entries):
            # No snapshot, no deletion: retention never goes past the newest one.
            raise ValueError("a retention run needs a snapshot interval")

    def broker_config(self) -> dict[str, Any]:
        """The broker configuration keys (segment size included)."""
        return {"segment_size_bytes": self.segment_size_bytes,
                "retention_bytes": self.retention_bytes,
                "retention_interval_ms": self.retention_interval_ms,
                "snapshot_interval_bytes": self.snapshot_interval_bytes,
                "snapshot_interval_entries": self.snapshot_interval_entries}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class NodeTrack:
    """What the monitor saw of one node."""

    samples: int = 0
    answered: int = 0
    first_index_first: int | None = None  # the first answer's
    first_index_last: int | None = None
    first_index_max: int = 0
    first_index_moves: int = 0  # answers whose first_index was above the previous answer's
    snapshot_index_max: int = 0
    snapshots_written: int = 0  # summed over the node's processes
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    # (seconds since the monitor started, first_index, snapshot_index,
    # installs_received so far): a row whenever one of them changed.
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)
    _last: dict[str, int] = field(default_factory=dict)
    _base: dict[str, int] = field(default_factory=dict)

    def _accumulate(self, name: str, value: int) -> int:
        """A counter summed over restarts: a drop means a new process."""
        last = self._last.get(name, 0)
        if value < last:
            self._base[name] = self._base.get(name, 0) + last
        self._last[name] = value
        return self._base.get(name, 0) + value

    def note(self, status: dict[str, Any] | None, t: float) -> None:
        self.samples += 1
        if status is None:
            return
        self.answered += 1
        first = int(status.get("first_index") or 0)
        snapshot = int(status.get("snapshot_index") or 0)
        if self.first_index_first is None:
            self.first_index_first = first
        if self.first_index_last is not None and first > self.first_index_last:
            self.first_index_moves += 1
        self.first_index_last = first
        self.first_index_max = max(self.first_index_max, first)
        self.snapshot_index_max = max(self.snapshot_index_max, snapshot)
        for name in COUNTERS:
            self.counters[name] = self._accumulate(name, int(status.get(name) or 0))
        snapshots = status.get("snapshots")
        written = int(snapshots.get("written") or 0) if isinstance(snapshots, dict) else 0
        self.snapshots_written = self._accumulate("snapshots_written", written)
        row = (round(t, 1), first, snapshot, self.counters["installs_received"])
        if not self.timeline or self.timeline[-1][1:] != row[1:]:
            self.timeline.append(row)

    def to_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "answered": self.answered,
                "first_index_first": self.first_index_first,
                "first_index_last": self.first_index_last,
                "first_index_max": self.first_index_max,
                "first_index_moves": self.first_index_moves,
                "snapshot_index_max": self.snapshot_index_max,
                "snapshots_written": self.snapshots_written, **self.counters,
                "timeline": [list(row) for row in self.timeline]}


class RetentionMonitor:
    """Samples every node's BROKER_STATUS every `interval` seconds until stopped."""

    def __init__(self, addresses: dict[int, str], status_of: StatusFn,
                 interval: float = 1.0) -> None:
        self.addresses = dict(addresses)
        self.status_of = status_of
        self.interval = interval
        self.nodes = {n: NodeTrack() for n in addresses}
        self._task: asyncio.Task[None] | None = None
        self._t0 = time.monotonic()

    async def sample(self) -> None:
        nodes = list(self.addresses)
        statuses = await asyncio.gather(*(self.status_of(self.addresses[n]) for n in nodes))
        t = time.monotonic() - self._t0
        for node, status in zip(nodes, statuses, strict=True):
            self.nodes[node].note(status, t)

    async def _loop(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop sampling after one last sample (the nodes' final figures)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.sample()

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {str(n): track.to_json() for n, track in sorted(self.nodes.items())}


def disk_evidence(data_dirs: dict[int, Path], segment_size: int) -> dict[str, dict[str, Any]]:
    """Per node, from its data directory after the run: the segment files it
    still has, the first one's base, and how many segments below it are gone."""
    out: dict[str, dict[str, Any]] = {}
    for node, data_dir in sorted(data_dirs.items()):
        files = segment_files(data_dir)
        bases = [int(p.name) for p in files]
        first = bases[0] if bases else 0
        out[str(node)] = {"segments": len(bases), "first_base": first,
                          "segments_gone": first // segment_size,
                          "bytes": sum(p.stat().st_size for p in files)}
    return out


def summarize(spec: RetentionSpec, monitored: dict[str, dict[str, Any]] | None,
              disk: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The `retention` section of results.json: settings, per node and totals."""
    monitored = monitored or {}
    nodes: dict[str, dict[str, Any]] = {}
    for node in sorted(set(monitored) | set(disk), key=int):
        nodes[node] = {**{k: v for k, v in monitored.get(node, {}).items()},
                       "disk": disk.get(node, {})}
    installs = sum(int(n.get("installs_received", 0)) for n in nodes.values())
    return {
        "settings": spec.to_json(),
        "segments_deleted": sum(int(n["disk"].get("segments_gone", 0)) for n in nodes.values()),
        "nodes_with_deletions": sorted(int(k) for k, n in nodes.items()
                                       if n["disk"].get("segments_gone", 0) > 0
                                       or n.get("first_index_moves", 0) > 0),
        "first_index_max": max((int(n.get("first_index_max", 0)) for n in nodes.values()),
                               default=0),
        "installs": installs,
        "nodes_installed": sorted(int(k) for k, n in nodes.items()
                                  if n.get("installs_received", 0) > 0),
        "nodes": nodes,
    }


def retention_problems(summary: dict[str, Any]) -> list[str]:
    """Why a run with retention on did not exercise it (empty: it did)."""
    if not summary["nodes_with_deletions"]:
        return ["retention deleted no segment on any node: the run did not exercise "
                "retention (lower --retention-bytes or --segment-size-bytes, or run longer)"]
    return []
