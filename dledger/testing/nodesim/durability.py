"""Durability checks against the simulated disk's ground truth, as things happen.

The runtime's own counters trust its own idea of what is durable; these
checks ask the `SimFileSystem` what a power cut *now* would keep:

- *acks*: with flush=sync a follower's successful AppendResponse for index i
  leaves only once entry i is durable on that follower (checked as the
  transport sends it);
- *checkpoints*: a checkpoint file, when it is replaced, vouches only for
  entries that are durable (recovery trusts it);
- *hard state*: the commit index saved never names an entry that is not
  durable (a restart replays up to it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from commitlog.checkpoint import read_checkpoint, read_hard_state
from dledger.messages import AppendResponse, Message

if TYPE_CHECKING:
    from dledger.testing.nodesim.harness import Harness, Slot


def durable(h: Harness, slot: Slot, index: int) -> bool:
    """Entry `index` of the node's log (as it reads now) would survive a power cut."""
    node = slot.node
    assert node is not None
    log = node.log
    if index < log.first_index:
        return True
    if index > log.last_index:
        return False
    record = log.index.read(index)  # queued records are served from memory
    assert record is not None, f"no index record for entry {index}"
    base = log.segments.base_of(record.position)
    path = log.segments.path(base)
    size = record.size
    at = record.position - base
    kept = h.fs.durable_slice(path, at, size)
    return kept is not None and kept == h.fs.volatile_slice(path, at, size)


def observe_send(h: Harness, node_id: int, messages: Sequence[Message]) -> None:
    if h.flush != "sync":
        return
    slot = h.slots[node_id]
    if slot.node is None:
        return
    for msg in messages:
        if isinstance(msg, AppendResponse) and msg.success and msg.index \
                and not durable(h, slot, msg.index):
            h.fail(f"n{node_id} acknowledged entry {msg.index} to n{msg.dst} before it was "
                   "durable")


def observe_replace(h: Harness, path: str) -> None:
    data_dir, name = os.path.split(path)
    slot = next((s for s in h.slots.values() if s.data_dir == data_dir), None)
    if slot is None or slot.node is None or name not in ("checkpoint", "hardstate"):
        return  # a ConsumeQueue checkpoint, or a node still opening its log
    if name == "checkpoint":
        ck = read_checkpoint(data_dir)
        if ck is not None and ck.durable_index >= ck.first_index \
                and not durable(h, slot, ck.durable_index):
            h.fail(f"n{slot.nid} checkpoint vouches for entry {ck.durable_index}, which is "
                   "not durable")
    else:
        hs = read_hard_state(data_dir)
        if hs is not None and hs.commit and not durable(h, slot, hs.commit):
            h.fail(f"n{slot.nid} saved commit index {hs.commit}, whose entry is not durable")
