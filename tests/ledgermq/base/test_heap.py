"""freeze_startup_heap: what exists when a server starts serving leaves the
cyclic collector's generations (so a full collection no longer walks it),
and what is allocated later is collected as before. In a child process: a
freeze is for the whole process's life."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import gc
    from ledgermq.base.heap import freeze_startup_heap

    class Node:
        def __init__(self):
            self.me = self  # a cycle: only the cyclic collector frees it

    startup = [[i] for i in range(20_000)]  # lists are always tracked
    frozen = freeze_startup_heap()
    assert frozen >= 20_000, frozen
    tracked = {id(o) for g in range(3) for o in gc.get_objects(generation=g)}
    assert not any(id(o) in tracked for o in startup[::997]), "startup objects still scanned"
    import weakref
    later = Node()
    ref = weakref.ref(later)
    del later
    gc.collect()
    assert ref() is None, "a cycle allocated after the freeze was not collected"
    print("ok", frozen)
""")


def test_the_startup_heap_is_frozen_and_later_garbage_still_collected() -> None:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")


SPACED = textwrap.dedent("""
    import gc, weakref
    from ledgermq.base.heap import FULL_COLLECTION_AFTER, settle_heap

    class Node:
        def __init__(self):
            self.me = self

    full = []
    gc.callbacks.append(lambda phase, info: phase == "stop" and full.append(info["generation"]))
    assert settle_heap() > 0  # what the servers call: freeze, then spacing
    assert gc.get_threshold()[2] == FULL_COLLECTION_AFTER, gc.get_threshold()
    later = Node()
    ref = weakref.ref(later)
    del later
    # No explicit collect: the automatic young collections still find it.
    kept = []
    for i in range(2_000_000):  # objects that live long enough to be promoted
        kept.append([i])
        if i % 20_000 == 19_999:
            kept.clear()
    assert ref() is None, "a young cycle was not collected automatically"
    middle = full.count(1)
    fulls = full.count(2)
    assert middle >= 2 * FULL_COLLECTION_AFTER, (middle, fulls)
    assert fulls <= middle // FULL_COLLECTION_AFTER + 1, (middle, fulls)
    print("ok", middle, fulls)
""")


def test_full_collections_are_spaced_and_young_cycles_still_collected() -> None:
    """settle_heap (space_full_collections): a full collection only after FULL_COLLECTION_AFTER
    collections of the middle generation; young garbage cycles are still freed
    by the automatic collections, without an explicit gc.collect()."""
    done = subprocess.run([sys.executable, "-c", SPACED], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok "), done.stdout
