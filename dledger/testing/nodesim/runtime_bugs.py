"""Bugs planted in the runtime and storage (not the Raft core), test only.

Each is a small monkeypatch applied for one simulated run and undone after,
so production code carries no switch. They prove the real-node simulator
catches storage-level mistakes that the core's simulator cannot see:

- `durable_at_sync_start`: the CommitLog declares a sync's entries durable
  when the sync *starts*, so the Flusher releases group-commit waiters (and
  the node acknowledges) before the fsync ran.
- `checkpoint_beyond_durable`: the checkpoint vouches for every written
  entry, not only the fsynced ones, so after a power cut recovery finds the
  log shorter than the checkpoint claims.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from commitlog.checkpoint import Checkpoint
from commitlog.log import CommitLog, SyncToken

RUNTIME_BUGS = ("durable_at_sync_start", "checkpoint_beyond_durable")


def _durable_at_sync_start(original: Any) -> Any:
    def begin_sync(self: CommitLog) -> SyncToken:
        token = original(self)
        self.durable_index, self.durable_end, self.durable_term = token.index, token.end, \
            token.term  # the bug: nothing is fsynced yet
        return token
    return begin_sync


def _checkpoint_beyond_durable(original: Any) -> Any:
    def checkpoint_value(self: CommitLog) -> Checkpoint:
        value: Checkpoint = original(self)
        return Checkpoint(self.last_index, self.end, self.last_term, value.first_index)
    return checkpoint_value


_PATCHES = {
    "durable_at_sync_start": ("begin_sync", _durable_at_sync_start),
    "checkpoint_beyond_durable": ("_checkpoint_value", _checkpoint_beyond_durable),
}


@contextlib.contextmanager
def planted(name: str) -> Iterator[None]:
    """Plant the runtime bug `name` (or nothing for "") inside the block."""
    if not name:
        yield
        return
    if name not in _PATCHES:
        raise ValueError(f"unknown runtime bug {name!r}; known: {', '.join(RUNTIME_BUGS)}")
    attribute, wrap = _PATCHES[name]
    original = getattr(CommitLog, attribute)
    setattr(CommitLog, attribute, wrap(original))
    try:
        yield
    finally:
        setattr(CommitLog, attribute, original)
