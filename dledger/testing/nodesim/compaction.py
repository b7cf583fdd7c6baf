"""Compaction in the real-node simulator: snapshots, log deletion below them, long lags.

While the faults run (`NodeSimOptions.compaction`), every 0.2-0.8 s of
virtual time one running node compacts, and now and then a follower lags:

- *compact*: the node's state machine is snapshotted at its applied index
  (only once that entry is durable on the node: a snapshot must not cover
  entries a power cut could take from its log), the snapshot is written
  with `commitlog.snapshot.write_snapshot` (on the node's simulated disk,
  faults included), the node is told (`note_snapshot`), and the segments
  wholly below the one holding that entry are deleted
  (`CommitLog.delete_before`), as the broker's retention does. Committed
  entries that go are remembered (`World.compacted`) for the final checks,
  which then cover the whole history, not only what the leader still holds.
  The snapshot records the configuration in effect at its index
  (`RaftGroupNode.membership_at`, as the broker's snapshotter does), checked
  against the committed one there (membership runs, flush=sync).
- *lag*: a follower is cut off both ways for 1.5-4 s, long enough for the
  others to compact past it; it catches up by snapshot install (the
  runtime's transfer, then `CommitLog.install` and the applier's `install`).

A storage error while compacting on a node with injected disk faults is
that node's failure (its process is cut off, as `Harness.watch` does);
without injected faults it is a violation.
"""

from __future__ import annotations

import asyncio
import random

import commitlog
from commitlog.errors import StorageError
from commitlog.snapshot import write_snapshot
from dledger.membership import encode
from dledger.testing.nodesim.apply import SnapshotApplier, digest, read_committed
from dledger.testing.nodesim.world import Slot, World

LAG_RATE = 0.2  # share of compaction steps that also start a lag


async def compactor(h: World, until: float) -> None:
    rng = h.compact_rng
    lagging: set[tuple[int, int]] = set()
    lag_ends = 0.0
    while h.clock.now < until - 0.5 and not h.violation:
        await asyncio.sleep(rng.uniform(0.2, 0.8))
        if h.healing or h.violation:
            break
        if lagging and h.clock.now >= lag_ends:
            _end_lag(h, lagging)
        if not lagging and rng.random() < LAG_RATE:
            lag_ends = h.clock.now + _lag(h, rng, lagging)
        up = [s for s in h.slots.values()
              if s.state == "up" and s.node is not None and s.node.failed is None]
        if up:
            compact(h, rng.choice(up))
    _end_lag(h, lagging)


def _lag(h: World, rng: random.Random, lagging: set[tuple[int, int]]) -> float:
    leader = h.leader()
    followers = [s.nid for s in h.in_play() if leader is None or s.nid != leader.nid]
    if not followers:
        return 0.0
    nid = rng.choice(followers)
    for other in h.slots:
        if other != nid:  # (every node: a spare added meanwhile is cut off too)
            for link in ((nid, other), (other, nid)):
                if link not in h.net.blocked:
                    h.net.blocked.add(link)
                    lagging.add(link)
    span = rng.uniform(1.5, 4.0)
    h.counts["lags"] += 1
    h.trace(f"compaction: n{nid} cut off for {span:.3f} s")
    return span


def _end_lag(h: World, lagging: set[tuple[int, int]]) -> None:
    if lagging:
        # Only the links this lag cut (a nemesis partition may hold others).
        h.net.blocked.difference_update(lagging)
        lagging.clear()
        h.trace("compaction: lag over")


def compact(h: World, slot: Slot) -> None:
    """Snapshot the node's state machine and delete its log below the snapshot."""
    node, applier = slot.node, slot.applier
    if node is None or not isinstance(applier, SnapshotApplier):
        return
    log = node.log
    index, state = applier.snapshot_state()
    if not log.first_index <= index <= log.durable_index:
        return
    term, end = log.term_at(index), log.entry_end(index)
    faults_before = h.fs.node_faults(slot.data_dir)
    try:
        membership = node.membership_at(index)
    except LookupError:
        return  # an install of a later snapshot is pending (as the broker's snapshotter)
    h.check_snapshot_membership(slot, index, encode(membership), "wrote")
    try:
        info = write_snapshot(slot.data_dir, index, term, end, state,
                              created_ms=int(h.clock.now * 1000),
                              membership=encode(membership))
        node.note_snapshot(info)
        h.counts["snapshots"] += 1
        target = log.segments.base_of(end - 1)
        if target <= log.segments.bases[0]:
            return
        going = [e for e in read_committed(log, log.first_index, index) if e.position < target]
        # Remembered before the deletion: a fault may stop it halfway, with
        # some of these segments already gone.
        if not _remember(h, slot, going):
            return
        deleted = log.delete_before(target)
    except (OSError, StorageError) as exc:
        if h.fs.node_faults(slot.data_dir) > faults_before:
            h.counts["node_failures"] += 1
            h.trace(f"n{slot.nid} compaction failed on an injected disk fault: {exc!r}")
            h.crash(slot)
            return
        h.fail(f"n{slot.nid} compaction at {index} failed: {exc!r}")
        return
    h.counts["compactions"] += 1
    h.counts["segments_deleted"] += deleted
    h.trace(f"n{slot.nid} snapshot {index} (term {term}); log now {log.first_index}.."
            f"{log.last_index} ({deleted} segments deleted)")


def _remember(h: World, slot: Slot, going: list[commitlog.Entry]) -> bool:
    """Record committed entries the node is about to delete (`World.compacted`);
    False on a violation (flush=sync: another node deleted another entry there)."""
    own = h.compacted_by.setdefault(slot.nid, {})
    for entry in going:
        own[entry.index] = record = (entry.term, digest(entry.body))
        known = h.compacted.setdefault(entry.index, record)
        if h.flush == "sync" and known != record:
            h.fail(f"n{slot.nid} deleted committed entry {entry.index} (term {entry.term}), "
                   f"but another node deleted {known} there")
            return False
        if h.membership and h.flush == "sync":
            h.configs.note_committed(entry.index, entry.term)
    return True
