"""Retention policy: where the leader would start the CommitLog, as a pure
function of its segments, the newest snapshot, the settings and the disk.

`trim_point` is what `broker.retention` runs on the leader every
`retention_interval_ms`: the oldest segments go when older than
`retention_hours` (by file mtime, as RocketMQ's fileReservedTime), beyond
`retention_bytes`, or early while the disk is above `disk_soft_ratio`; never
the segment holding anything past the newest snapshot (those entries rebuild
the state after it) and never the last segment. Only a prefix ever goes:
the answer is a segment base, and every segment wholly below it may be
deleted. Nothing here does I/O but `disk_usage`.

`retention_bytes` is a ceiling, not a target: the log keeps growing until
the next pass, so the size rule cuts `headroom_bytes` below it (the caller
passes what the log grew by between passes, measured), and the segments
reach `retention_bytes` only just before the next deletion. The headroom
never exceeds half of `retention_bytes`: a log that grows by more than that
between two passes (a limit of a few segments) still keeps half its limit
after a cut, and then overshoots the limit rather than keeping nothing.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ledgermq.broker.config import BrokerConfig

HOUR_MS = 3_600_000


class SegmentLike(Protocol):
    """One CommitLog segment as the policy sees it (`commitlog.SegmentInfo`)."""

    @property
    def base(self) -> int: ...

    @property
    def length(self) -> int: ...

    @property
    def first_index(self) -> int: ...

    @property
    def mtime_ms(self) -> int: ...


@dataclass(frozen=True)
class RetentionSettings:
    """The retention keys of a BrokerConfig, in the units the policy uses."""

    retention_ms: int = 72 * HOUR_MS  # 0: no age limit
    retention_bytes: int = 0  # 0: no size limit
    soft_ratio: float = 0.75
    hard_ratio: float = 0.85

    @classmethod
    def from_config(cls, config: BrokerConfig) -> RetentionSettings:
        return cls(round(config.retention_hours * HOUR_MS), config.retention_bytes,
                   config.disk_soft_ratio, config.disk_hard_ratio)


@dataclass(frozen=True)
class DiskUsage:
    """The file system holding the data directory, as `df` reports it."""

    total_bytes: int
    used_bytes: int
    free_bytes: int  # available to this (unprivileged) process

    @property
    def ratio(self) -> float:
        """Used / (used + available): df's Use%, so root's reserve counts as full."""
        usable = self.used_bytes + self.free_bytes
        return self.used_bytes / usable if usable > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"total_bytes": self.total_bytes, "used_bytes": self.used_bytes,
                "free_bytes": self.free_bytes, "usage_ratio": round(self.ratio, 6)}


def disk_usage(path: str) -> DiskUsage:
    """Sample the file system of `path` (a statvfs; run it off the loop)."""
    usage = shutil.disk_usage(path)
    return DiskUsage(usage.total, usage.used, usage.free)


@dataclass(frozen=True)
class TrimDecision:
    """Where the policy would start the log, and why.

    `position` is a segment base: every segment wholly below it may go.
    `wanted` is where the rules alone would start it; `limit` is the furthest
    the safety rules allow (the snapshot's segment, the last segment), and
    `blocked_by` names the one that held `wanted` back, if any. `headroom`
    is how far below `retention_bytes` the size rule cut (the growth
    expected before the next pass).
    """

    first: int  # the first segment's base now
    position: int
    wanted: int
    limit: int
    reasons: tuple[str, ...] = ()
    blocked_by: str | None = None
    headroom: int = 0

    @property
    def deletes(self) -> bool:
        """Whether the decision removes at least one segment."""
        return self.position > self.first

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "position": self.position, "wanted": self.wanted,
                "limit": self.limit, "reasons": list(self.reasons),
                "blocked_by": self.blocked_by, "headroom": self.headroom}


def trim_point(segments: Sequence[SegmentLike], snapshot_end: int | None,
               settings: RetentionSettings, now: int, disk: DiskUsage | None = None,
               headroom_bytes: int = 0) -> TrimDecision:
    """The leader's trim point over `segments` (oldest first).

    Each rule gives the base of the first segment it keeps; the decision is
    the furthest of them, held back to the safety limit: the first segment
    holding anything past `snapshot_end` (None: no snapshot, nothing may go)
    and the last segment. Only a prefix of segments ever goes: a younger
    segment below an old one (which cannot happen with mtimes, but can with
    clocks) stops the age rule rather than leaving a hole. The size rule
    keeps at most `retention_bytes - headroom_bytes`, the headroom taken up
    to half of `retention_bytes`: room for what the log will take before the
    next pass deletes again.
    """
    headroom = min(max(headroom_bytes, 0), settings.retention_bytes // 2)
    if not segments:
        return TrimDecision(0, 0, 0, 0, headroom=headroom)
    first = segments[0].base
    keep_age = keep_size = keep_disk = first
    reasons: list[str] = []
    # Age: the oldest contiguous run of segments last written before the cut.
    if settings.retention_ms > 0:
        cutoff = now - settings.retention_ms
        # mtime 0: a file system that keeps no times; never "old".
        keep_age = _first_kept(segments, lambda s, _gone: 0 < s.mtime_ms < cutoff)
    # Size: drop the oldest while the segments hold more than the limit.
    if settings.retention_bytes > 0:
        total = sum(s.length for s in segments)
        target = settings.retention_bytes - headroom
        keep_size = _first_kept(segments, lambda _s, gone: total - gone > target)
    # Soft watermark: free what brings the disk back under the ratio.
    if disk is not None and disk.ratio > settings.soft_ratio:
        target = int(settings.soft_ratio * (disk.used_bytes + disk.free_bytes))
        excess = disk.used_bytes - target
        keep_disk = _first_kept(segments, lambda _s, gone: gone < excess)
    for name, keep in (("age", keep_age), ("size", keep_size), ("disk_soft", keep_disk)):
        if keep > first:
            reasons.append(name)
    wanted = max(keep_age, keep_size, keep_disk)
    # Safety: the snapshot's segment, and the last one, always stay.
    snapshot_limit = first
    if snapshot_end is not None:
        snapshot_limit = next((s.base for s in segments if s.base + s.length > snapshot_end),
                              segments[-1].base)
    last_limit = segments[-1].base
    limit = min(snapshot_limit, last_limit)
    blocked_by = None
    if wanted > limit:
        blocked_by = "snapshot" if snapshot_limit < last_limit else "last_segment"
    return TrimDecision(first, min(wanted, limit), wanted, limit, tuple(reasons), blocked_by,
                        headroom)


def _first_kept(segments: Sequence[SegmentLike],
                goes: Callable[[SegmentLike, int], bool]) -> int:
    """Base of the first segment that does not go: `goes(segment, bytes of
    the segments before it that go)` decides, oldest first. When every segment
    would go the answer is past the last one (the caller's limit applies)."""
    gone = 0
    for segment in segments:
        if not goes(segment, gone):
            return segment.base
        gone += segment.length
    last = segments[-1]
    return last.base + max(last.length, 1)


def segment_floor(position: int, segment_size: int) -> int:
    """The base of the segment holding `position`."""
    return position - position % segment_size
