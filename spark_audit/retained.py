"""Which committed indexes retention removed, and which no retention explains.

Retention removes a replica's log only below an index its snapshot covers,
and a broker snapshots applied, hence committed, entries. So a replica whose
log retention cut at first index F, with a usable snapshot at S, *vouches*
for every index up to ``min(F - 1, S)``: it held that index once, and the
index was committed. The group's log checks (``checks.check_group``) count
such a replica toward the majority of an index it no longer holds, and
treat an index that a majority vouches for as committed even when no
replica holds it any more: it was *retained away*, not lost.

What retention cannot explain stays a fault: an index fewer than a majority
vouch for (no snapshot covers it), and an index inside the range a replica
should still hold (from its checkpoint's first index to its last entry: a
lost middle segment, a damaged entry), which its own findings report and
which history messages are not excused for.

The functions here work on plain numbers, so the rule reads on its own; the
span arithmetic at the end (``outside_spans``, ``join_spans``) serves the
nightly rotation too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Gap:
    """Committed indexes ``lo..hi`` that no replica holds, at positions
    ``[pos_lo, pos_hi)`` of the log, removed by retention on ``vouchers``."""

    lo: int
    hi: int
    pos_lo: int
    pos_hi: int
    vouchers: tuple[int, ...]  # replica ids whose snapshots cover the whole gap


def vouched_counts(limits: np.ndarray, index: np.ndarray) -> np.ndarray:
    """How many replicas vouch for each of ``index`` (``limits``: each vouching
    replica's last vouched index, any order)."""
    lim = np.sort(np.asarray(limits, np.int64))
    counts: np.ndarray = len(lim) - np.searchsorted(lim, np.asarray(index, np.int64),
                                                    side="left")
    return counts


def majority_vouched(limits: np.ndarray, majority: int) -> int:
    """The last index a majority vouches for (every lower one too), 0 for none."""
    lim = np.sort(np.asarray(limits, np.int64))[::-1]
    return int(lim[majority - 1]) if len(lim) >= majority else 0


def bridge(held: np.ndarray, through: int) -> tuple[int, list[tuple[int, int]]]:
    """The end of the committed run starting at ``held[0]``, and the gaps it spans.

    ``held`` are the sorted indexes a majority holds (or vouches for, with the
    holders); a gap between two of them is spanned when every index of it is
    at most ``through`` (a majority vouches for it), else the run ends before
    it. Returns (run end, spanned gaps as (lo, hi)); (0, []) for no index.
    """
    if not len(held):
        return 0, []
    gaps: list[tuple[int, int]] = []
    for k in np.nonzero(np.diff(held) != 1)[0]:
        lo, hi = int(held[k]) + 1, int(held[k + 1]) - 1
        if hi > through:
            return int(held[k]), gaps
        gaps.append((lo, hi))
    return int(held[-1]), gaps


def outside_spans(lo: int, hi: int, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``lo..hi`` (inclusive) that no span ``(a, b)`` (inclusive) covers."""
    parts = [(lo, hi)]
    for a, b in spans:
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


def join_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans ``(a, b)`` (inclusive) sorted, with overlapping or touching neighbours joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
