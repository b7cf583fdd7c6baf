"""Bugs planted in the runtime and storage (not the Raft core), test only.

Each is a small monkeypatch applied for one simulated run and undone after,
so production code carries no switch. They prove the real-node simulator
catches storage-level mistakes that the core's simulator cannot see:

- `ack_round_before_fsync`: the Flusher releases a group-commit round's
  waiters as soon as it hands the fsync to its worker, not when the fsync
  returns, and a sync in place (`Flusher.sync_now`) moves the durable point
  and returns before its fsync, which runs one loop pass later: the node
  acknowledges entries (to the leader, or as leader to the client) that a
  power cut can still take.
- `checkpoint_beyond_durable`: the checkpoint vouches for every written
  entry, not only the fsynced ones, so after a power cut recovery finds the
  log shorter than the checkpoint claims.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from commitlog.checkpoint import Checkpoint
from commitlog.flush import Flusher
from commitlog.log import CommitLog

RUNTIME_BUGS = ("ack_round_before_fsync", "checkpoint_beyond_durable")


def _ack_round_before_fsync(original: Any) -> Any:
    def begin_round(self: Flusher) -> bool:
        started: bool = original(self)
        if started and self._round_token is not None:
            # The bug: the durable point moves and the waiters go before the fsync ran.
            self.log.finish_sync(self._round_token)
            for future in self._inflight or ():
                if not future.done():
                    future.set_result(None)
        return started
    return begin_round


def _sync_now_before_fsync(original: Any) -> Any:
    def sync_now(self: Flusher) -> bool:
        if not self.idle:
            return False
        log = self.log
        token = log.begin_sync()
        # The bug: durable at once; the fsync itself runs a loop pass later.
        log.finish_sync(token)
        asyncio.get_running_loop().call_soon(log.run_sync, token)
        return True
    return sync_now


def _checkpoint_beyond_durable(original: Any) -> Any:
    def checkpoint_value(self: CommitLog) -> Checkpoint:
        value: Checkpoint = original(self)
        return Checkpoint(self.last_index, self.end, self.last_term, value.first_index)
    return checkpoint_value


_PATCHES: dict[str, list[tuple[type, str, Callable[[Any], Any]]]] = {
    "ack_round_before_fsync": [(Flusher, "_begin_round", _ack_round_before_fsync),
                               (Flusher, "sync_now", _sync_now_before_fsync)],
    "checkpoint_beyond_durable": [(CommitLog, "_checkpoint_value", _checkpoint_beyond_durable)],
}


@contextlib.contextmanager
def planted(name: str) -> Iterator[None]:
    """Plant the runtime bug `name` (or nothing for "") inside the block."""
    if not name:
        yield
        return
    if name not in _PATCHES:
        raise ValueError(f"unknown runtime bug {name!r}; known: {', '.join(RUNTIME_BUGS)}")
    originals = []
    for owner, attribute, wrap in _PATCHES[name]:
        original = getattr(owner, attribute)
        originals.append((owner, attribute, original))
        setattr(owner, attribute, wrap(original))
    try:
        yield
    finally:
        for owner, attribute, original in originals:
            setattr(owner, attribute, original)
