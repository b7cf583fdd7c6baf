"""The cyclic garbage collector of a long-running server: its pauses bounded.

A full collection walks every tracked object. A broker holds a few hundred
thousand of them once it has started (modules, classes, the recovered state),
so a full collection stops the event loop for 35-100 ms on this 2-core
machine, and with one message per request those pauses are the p99 (issue
18: W=64 with the SDK's merging off, p50 5 ms, p99 30-60 ms). Servers call
`settle_heap()` once they are serving: what exists then is moved to the
collector's permanent generation, which no collection scans again, so a
full collection only walks what was allocated since
(`freeze_startup_heap`), and full collections come ten times less often
than CPython's default (`space_full_collections`).
"""

from __future__ import annotations

import gc

# CPython starts a full collection after 10 collections of the middle
# generation (once what was promoted since the last one exceeds a quarter of
# the long-lived heap). Under load nearly every request's objects live long
# enough to be promoted before reference counting frees them, so a full
# collection came every second or so, each walking the whole long-lived
# state (the producers' dedup windows above all: 5-15 ms of CPU on this
# machine, a pause of the loop). Under a send load they find nothing: the
# send path leaves no reference cycles (tests/ledgermq/wire/
# test_server_connection.py), so a full collection after 100 of the middle
# generation's instead (measured in docs/broker.md, "Reference cycles and
# full collections").
FULL_COLLECTION_AFTER = 100


def space_full_collections(after: int = FULL_COLLECTION_AFTER) -> None:
    """Start a full collection only after `after` collections of the middle
    generation (the young generations are collected as before)."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, after)


def freeze_startup_heap() -> int:
    """Collect once, then exempt every surviving object from later
    collections; how many objects were frozen. Garbage among them is not
    reclaimed (the startup heap is kept for the process's life anyway)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def settle_heap() -> int:
    """What a server calls once it serves: `freeze_startup_heap`, then
    `space_full_collections`; how many objects were frozen."""
    frozen = freeze_startup_heap()
    space_full_collections()
    return frozen
