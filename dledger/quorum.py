"""Pure commit arithmetic."""

from __future__ import annotations


def quorum_index(match_indexes: list[int]) -> int:
    """Highest index stored on a majority of `match_indexes` (one per voter).

    Sorted descending, the value at position quorum - 1 is held by at least a
    quorum of voters.
    """
    if not match_indexes:
        raise ValueError("no voters")
    ordered = sorted(match_indexes, reverse=True)
    return ordered[len(ordered) // 2]
