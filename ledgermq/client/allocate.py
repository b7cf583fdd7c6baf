"""Queue allocation among the members of a consumer group (clustering mode).

Same rule as RocketMQ's AllocateMessageQueueAveragely: queues and member ids
are sorted, each member gets a contiguous block, the first `len(queues) %
len(members)` members one queue more. Every member computes the same answer
from the same inputs, so no coordinator is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

Q = TypeVar("Q")


def allocate_averagely(queues: Sequence[Q], members: Sequence[str], me: str) -> list[Q]:
    ordered_members = sorted(set(members))
    if me not in ordered_members or not queues:
        return []
    ordered = sorted(queues)  # type: ignore[type-var]
    index = ordered_members.index(me)
    n, m = len(ordered), len(ordered_members)
    if n <= m:
        return [ordered[index]] if index < n else []
    base, extra = divmod(n, m)
    start = index * base + min(index, extra)
    return ordered[start : start + base + (1 if index < extra else 0)]
