"""Moved-forward ranges: what the readers of a run were told retention had
deleted, and whether an acknowledged message nobody read had expired.

A `moved` op (chaos.workload) says that a reader asked for offset `from` of
a queue and was answered "moved forward" to `to`: offsets [from, to) of that
queue were no longer stored on the node that answered. `MovedRanges` keeps
the union of such ranges per queue.

`expiry` is the verdict on one acknowledged message that the judging reads
(the drain's, or every read when there was no drain) never returned:

- its queue offset is known: `expired` when the judging readers were told
  that offset was deleted (it lies in one of their moved ranges), else
  `lost` (it was still inside retention when they read and is missing);
- a read returned it elsewhere (a live consumer): that read's offset is
  its offset, judged as above;
- its offset is unknown (an ack that did not say it, replicate=async, and
  nobody read it) but its queue is known: the real-time order of the
  history bounds it. Another send to the same queue whose offset is known
  (from its ack or a read) and whose ack was recorded before this one was
  invoked sits at a lower offset; one invoked after this one's ack sits at a
  higher offset (if this one is stored at all: offsets follow the log's
  order). Every offset in the open interval between those bounds deleted:
  `expired`; none of them deleted, or no offset left between them: `lost`;
  some: `expired_unknown` (reported as its own count: the checker cannot
  tell, and says so rather than guess);
- its queue is unknown too: `expired_unknown` when the judging readers were
  moved forward on some queue of its topic, else `lost`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from chaos.history import Op

QueueKey = tuple[str, str, int]  # (group, topic, queue)


@dataclass(frozen=True)
class Move:
    """One "moved forward" answer a reader acted on: [start, to) of `queue` gone."""

    queue: QueueKey
    start: int
    to: int
    process: int | str
    drain: bool
    index: int  # the op's place in the history
    time_ns: int


def moves_of(ops: Iterable[Op]) -> list[Move]:
    """Every `moved` ok op of a history (jumps that do not go forward are ignored:
    they excuse nothing)."""
    out = []
    for op in ops:
        if op.f != "moved" or op.type != "ok" or not isinstance(op.value, dict):
            continue
        v = op.value
        try:
            queue = (str(v.get("group") or ""), str(v.get("topic") or ""), int(v["queue"]))
            start, to = int(v["from"]), int(v["to"])
        except (KeyError, TypeError, ValueError):
            continue
        if to > start:
            out.append(Move(queue, start, to, op.process, bool(v.get("drain")), op.index,
                            op.time_ns))
    return out


class MovedRanges:
    """The union of moved ranges per queue, merged into disjoint sorted intervals."""

    def __init__(self, moves: Iterable[Move]) -> None:
        spans: dict[QueueKey, list[tuple[int, int]]] = defaultdict(list)
        for m in moves:
            spans[m.queue].append((m.start, m.to))
        self._starts: dict[QueueKey, list[int]] = {}
        self._ends: dict[QueueKey, list[int]] = {}
        for queue, items in spans.items():
            merged: list[list[int]] = []
            for lo, hi in sorted(items):
                if merged and lo <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            self._starts[queue] = [lo for lo, _ in merged]
            self._ends[queue] = [hi for _, hi in merged]

    def __bool__(self) -> bool:
        return bool(self._starts)

    def queues(self) -> list[QueueKey]:
        return sorted(self._starts)

    def _span(self, queue: QueueKey, offset: int) -> tuple[int, int] | None:
        starts = self._starts.get(queue)
        if not starts:
            return None
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0 or offset >= self._ends[queue][i]:
            return None
        return starts[i], self._ends[queue][i]

    def covers(self, queue: QueueKey, offset: int) -> bool:
        """Whether `offset` of `queue` lies in a moved range."""
        return self._span(queue, offset) is not None

    def covers_all(self, queue: QueueKey, lo: int, hi: int) -> bool:
        """Whether every offset of [lo, hi) lies in a moved range (an empty one does)."""
        if hi <= lo:
            return True
        span = self._span(queue, lo)
        return span is not None and span[1] >= hi

    def covers_any(self, queue: QueueKey, lo: int, hi: int | None) -> bool:
        """Whether some offset of [lo, hi) (hi None: unbounded) lies in a moved range."""
        if hi is not None and hi <= lo:
            return False
        if self.covers(queue, lo):
            return True
        starts = self._starts.get(queue, [])
        i = bisect.bisect_right(starts, lo)  # the first range starting after lo
        return i < len(starts) and (hi is None or starts[i] < hi)

    def floor(self, queue: QueueKey) -> int:
        """The first offset of `queue` from 0 not in a moved range (0: none from 0)."""
        span = self._span(queue, 0)
        return span[1] if span is not None else 0


@dataclass(frozen=True)
class Ack:
    """An acknowledged send as `expiry` needs it: where it is (`offset`: from
    its ack, else from any read of it; None: unknown) and when it was invoked
    and acknowledged (history indexes)."""

    value: int
    topic: str
    queue: QueueKey | None
    offset: int | None
    invoke_index: int
    done_index: int


class OffsetBounds:
    """The real-time bounds on an offset, from the acks whose offsets are known.

    Offsets of one queue are given in log order, so an ack recorded before
    another send was invoked names a lower offset than that send will get,
    if it is stored at all. Per queue: the known acks sorted by their ack's
    index with a running maximum of offsets, and sorted by their invoke's
    index with a running minimum from the end."""

    def __init__(self, known: Iterable[Ack]) -> None:
        by_queue: dict[QueueKey, list[Ack]] = defaultdict(list)
        for a in known:
            if a.queue is not None and a.offset is not None:
                by_queue[a.queue].append(a)
        self._done: dict[QueueKey, tuple[list[int], list[int]]] = {}
        self._invoked: dict[QueueKey, tuple[list[int], list[int]]] = {}
        for queue, acks in by_queue.items():
            done = sorted(acks, key=lambda a: a.done_index)
            running, highest = [], -1
            for a in done:
                highest = max(highest, a.offset if a.offset is not None else -1)
                running.append(highest)
            self._done[queue] = ([a.done_index for a in done], running)
            invoked = sorted(acks, key=lambda a: a.invoke_index)
            lowest: list[int] = []
            least: int | None = None
            for a in reversed(invoked):
                assert a.offset is not None
                least = a.offset if least is None else min(least, a.offset)
                lowest.append(least)
            lowest.reverse()
            self._invoked[queue] = ([a.invoke_index for a in invoked], lowest)

    def between(self, ack: Ack) -> tuple[int, int | None]:
        """The open interval (lo, hi) `ack`'s offset lies in (lo -1, hi None: unbounded)."""
        assert ack.queue is not None
        lo, hi = -1, None
        if ack.queue in self._done:
            indexes, running = self._done[ack.queue]
            i = bisect.bisect_left(indexes, ack.invoke_index)  # acks recorded before
            if i > 0:
                lo = running[i - 1]
        if ack.queue in self._invoked:
            indexes, lowest = self._invoked[ack.queue]
            i = bisect.bisect_right(indexes, ack.done_index)  # invoked after
            if i < len(indexes):
                hi = lowest[i]
        return lo, hi


def expiry(ack: Ack, ranges: MovedRanges, bounds: OffsetBounds) -> tuple[str, dict[str, Any]]:
    """"expired", "expired_unknown" or "lost" for an acknowledged message the judging
    reads never returned, and why (see the module docstring)."""
    if ack.queue is None:
        moved = any(q[1] == ack.topic for q in ranges.queues())
        return ("expired_unknown" if moved else "lost"), {"queue": None, "offset": None}
    where: dict[str, Any] = {"queue": list(ack.queue), "offset": ack.offset}
    if ack.offset is not None:
        return ("expired" if ranges.covers(ack.queue, ack.offset) else "lost"), where
    lo, hi = bounds.between(ack)
    where["between"] = [lo, hi]
    if hi is not None and hi <= lo + 1:
        return "lost", where  # no offset is left between its neighbours: not stored
    if hi is not None and ranges.covers_all(ack.queue, lo + 1, hi):
        return "expired", where
    if not ranges.covers_any(ack.queue, lo + 1, hi):
        return "lost", where
    return "expired_unknown", where
