"""Which verified spans a night re-reads, and what retention took: plain numbers in,
plain numbers out, so the rule reads on its own and a property test can drive it
through any sequence of nights, cuts and retention points.

**The rotation.** The verified spans of a group form a queue ordered by the
night each was last verified (then by index): a round-robin cursor that
always points at the stalest span. Each night takes spans from the front,
whole, until it holds at least ``ceil(V / N)`` indexes (``V``: every index
the manifest keeps, ``N``: ``--rolling-nights``) *and* every span last
verified ``N`` nights ago or earlier; it re-verifies them and they go to the
back, stamped with tonight, as do tonight's new spans. So

- every retained index is re-verified within ``N`` nights of its last
  verification (a span that reaches that age is always taken: by
  construction, whatever the growth or retention between nights), and
- the load is spread: about ``V / N`` indexes a night, more only when a
  large new range verified ``N`` nights ago falls due at once.

Because spans verified together are re-verified together and tonight's go
to the back, the front of the queue is, in index order, one contiguous
block, or two where the rotation wraps from the top of the log back to its
bottom (``windows``); each is audited as one window.

**Retention.** Spans wholly below the lowest first index any replica keeps
on disk were deleted by retention everywhere: dropped from the manifest and
reported as ``dropped``, never as lost (``trim``); a span the floor cuts
through keeps its upper part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Range = tuple[int, int]


@dataclass(frozen=True)
class Aged:
    """A verified span ``lo..hi``, last verified on night ``night_no`` of the rotation."""

    lo: int
    hi: int
    night_no: int

    @property
    def size(self) -> int:
        return self.hi - self.lo + 1


def quota(spans: list[Aged], nights: int) -> int:
    """Indexes a night re-verifies at least: ``ceil(V / N)``."""
    total = sum(s.size for s in spans)
    return math.ceil(total / max(1, nights)) if total else 0


def select(spans: list[Aged], tonight: int, nights: int) -> list[Aged]:
    """The spans night ``tonight`` re-verifies (in index order): the stalest first,
    until the quota is met and nothing left is due (verified ``nights`` ago)."""
    want = quota(spans, nights)
    out: list[Aged] = []
    taken = 0
    for s in sorted(spans, key=lambda s: (s.night_no, s.lo)):
        if taken >= want and s.night_no > tonight - nights:
            break  # the rest is fresher still (ascending night_no)
        out.append(s)
        taken += s.size
    return sorted(out, key=lambda s: s.lo)


def merge(ranges: list[Range]) -> list[Range]:
    """Sorted ranges with touching neighbours joined."""
    out: list[Range] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def windows(spans: list[Aged]) -> list[Range]:
    """The contiguous index ranges the selected spans make (one audit window each)."""
    return merge([(s.lo, s.hi) for s in spans])


def trim(spans: list[Aged], floor: int) -> tuple[list[Aged], list[Range]]:
    """Spans after retention removed everything below ``floor`` on every replica:
    (what is kept, the ranges dropped)."""
    kept: list[Aged] = []
    dropped: list[Range] = []
    for s in spans:
        if s.hi < floor:
            dropped.append((s.lo, s.hi))
        elif s.lo < floor:
            dropped.append((s.lo, floor - 1))
            kept.append(Aged(floor, s.hi, s.night_no))
        else:
            kept.append(s)
    return kept, merge(dropped)


def subtract(lo: int, hi: int, holes: list[Range]) -> list[Range]:
    """The parts of ``lo..hi`` outside every range of ``holes``."""
    parts = [(lo, hi)]
    for a, b in holes:
        nxt = []
        for x, y in parts:
            if b < x or a > y:
                nxt.append((x, y))
                continue
            if x < a:
                nxt.append((x, a - 1))
            if b < y:
                nxt.append((b + 1, y))
        parts = nxt
    return parts


def new_range(verified_through: int, floor: int, committed: int) -> Range | None:
    """Tonight's new range: after what was verified and what retention keeps, up to the
    committed index (None: nothing new)."""
    lo = max(verified_through + 1, floor)
    return (lo, committed) if lo <= committed else None
