"""Examples and counts found in pieces, merged into the findings one whole pass gives.

Most checks report, per stream (check, kind, group, replica, topic, queue),
the first ``max_examples`` occurrences in some order and one "further
occurrences not listed" row with the rest's count. When the occurrences are
found in pieces (a file, a range of indexes or positions), each piece keeps
its first ``max_examples + 1`` (with their sort order) and its total; the
driver merges the pieces: sorts the kept ones, keeps the first
``max_examples`` and counts the rest. Since every piece kept its own first
``max_examples + 1``, the merged first ones are exactly the whole pass's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from spark_audit.checks import VIOLATION, FindingRow, Findings

# (check, kind, gid, rid, topic, queue_id)
StreamKey = tuple[str, str, int, int, str, int]
# (order, finding fields, index for a "further" row if this is the first one not shown)
Hit = tuple[tuple[int, ...], dict[str, Any], int]


class Hits:
    """Occurrences of one piece, by stream: the first ``limit`` kept, all counted."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.streams: dict[StreamKey, tuple[int, list[Hit]]] = {}

    def add(self, key: StreamKey, total: int, hits: Iterable[Hit]) -> None:
        if not total:
            return
        n, kept = self.streams.get(key, (0, []))
        kept = sorted([*kept, *hits], key=lambda h: h[0])[:self.limit]
        self.streams[key] = (n + total, kept)

    def dump(self) -> list[Any]:
        return [[list(k), n, [[list(o), f, x] for o, f, x in hs]]
                for k, (n, hs) in self.streams.items()]


def load(dumped: Iterable[Any]) -> list[tuple[StreamKey, int, list[Hit]]]:
    """Inverse of ``Hits.dump``."""
    out = []
    for k, n, hs in dumped:
        key = (str(k[0]), str(k[1]), int(k[2]), int(k[3]), str(k[4]), int(k[5]))
        out.append((key, int(n), [(tuple(o), dict(f), int(x)) for o, f, x in hs]))
    return out


def merge(pieces: Iterable[tuple[StreamKey, int, list[Hit]]], max_examples: int,
          out: Findings) -> None:
    """Findings of every stream from its pieces (see the module docstring)."""
    total: dict[StreamKey, int] = defaultdict(int)
    kept: dict[StreamKey, list[Hit]] = defaultdict(list)
    for key, n, hs in pieces:
        total[key] += n
        kept[key] += hs
    for key in sorted(total):
        check, kind, gid, rid, topic, queue_id = key
        hs = sorted(kept[key], key=lambda h: h[0])
        for _, fields, _ in hs[:max_examples]:
            row: dict[str, Any] = {"gid": gid, "rid": rid, "topic": topic,
                                   "queue_id": queue_id, **fields}
            out.add(check, kind, VIOLATION, **row)
        if total[key] > max_examples:
            nxt = hs[max_examples][2] if len(hs) > max_examples else -1
            out.add(check, kind, VIOLATION, gid=gid, rid=rid, topic=topic, queue_id=queue_id,
                    index=nxt, count=total[key] - max_examples,
                    detail="further occurrences not listed")


def row_fields(row: FindingRow) -> dict[str, Any]:
    """The fields of a finding row that a hit carries (its stream's are in the key)."""
    return {k: v for k, v in row.items()
            if k not in ("check", "kind", "severity", "gid", "rid", "topic", "queue_id")}
