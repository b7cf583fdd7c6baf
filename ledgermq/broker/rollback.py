"""Rolling a replica back onto the group's log after a committed divergence.

Under `flush = "async"` a power cut can take entries a majority had
acknowledged; the group then goes on without them and a replica that kept
them (it synced later than the others) holds a committed prefix the group's
log contradicts. The Raft core detects it (`CommittedDivergence`) and the node
stops. With `on_divergence = "rollback"` (the default under flush=async,
whose contract allows that loss) the broker then:

1. writes `ROLLBACK` (the first diverged index, why, when) into its data
   directory and restarts its own process (the same PID: `os.execv`);
2. at the next start, before anything opens the log, sets the diverged part
   aside in `diverged-<ms>/` — copies of the segments and index files that
   hold it, the hard state and checkpoint, and the whole ConsumeQueue
   directory (moved, not copied) — never deleting a byte of it;
3. cuts the CommitLog before the diverged index, lowers the saved commit
   index to match, moves aside the broker-state snapshots taken at or after
   the diverged index (they describe the diverged state), and removes the
   marker. The ConsumeQueues and the broker's
   state are then rebuilt from the log by the normal start-up replay, and the
   node rejoins as a follower that the leader fills in from there.

A crash at any step repeats it from the marker: every step is idempotent.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

from commitlog import CommitLog, CommitLogConfig, HardState
from commitlog.disk import atomic_replace
from commitlog.snapshot import SNAPSHOTS_DIR, snapshots_root

log = logging.getLogger(__name__)

MARKER = "ROLLBACK"
ASIDE_PREFIX = "diverged-"


@dataclass(frozen=True)
class Rollback:
    """What a rollback did (logged, and returned for tests)."""

    from_index: int
    kept_last_index: int
    aside: str
    reason: str


def request_rollback(data_dir: str, from_index: int, reason: str) -> None:
    """Record, durably, that entries from `from_index` on must be set aside at
    the next start (the marker survives a crash before the restart)."""
    body = {"from_index": int(from_index), "reason": reason, "at_ms": time.time_ns() // 10**6}
    atomic_replace(os.path.join(data_dir, MARKER), json.dumps(body).encode())


def pending(data_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(data_dir, MARKER), "rb") as handle:
            raw = json.loads(handle.read())
    except FileNotFoundError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("from_index"), int) \
            or raw["from_index"] < 1:
        raise ValueError(f"{data_dir}/{MARKER} is not a rollback marker: {raw!r}")
    return raw


def apply_pending(data_dir: str, config: CommitLogConfig) -> Rollback | None:
    """Carry out a requested rollback (see the module docstring); None if none."""
    marker = pending(data_dir)
    if marker is None:
        return None
    first = int(marker["from_index"])
    aside = os.path.join(data_dir, f"{ASIDE_PREFIX}{int(marker['at_ms'])}")
    os.makedirs(aside, exist_ok=True)
    with CommitLog.open(data_dir, config) as commit_log:
        _copy_tail(commit_log, first, aside)
        for name in ("hardstate", "checkpoint"):
            source = os.path.join(data_dir, name)
            if os.path.exists(source):
                shutil.copy2(source, os.path.join(aside, name))
        keep = min(first - 1, commit_log.last_index)
        commit_log.truncate_after(keep)
        state = commit_log.load_hard_state()
        commit_log.save_hard_state(HardState(state.term, state.vote, min(state.commit, keep)))
    queues = os.path.join(data_dir, "consumequeue")
    if os.path.isdir(queues):
        os.replace(queues, os.path.join(aside, "consumequeue"))
    _move_snapshots(data_dir, first, aside)
    os.remove(os.path.join(data_dir, MARKER))
    done = Rollback(first, keep, aside, str(marker.get("reason", "")))
    log.warning("rolled back onto the group's log: entries from %d set aside in %s (%s)",
                first, aside, done.reason)
    return done


def _move_snapshots(data_dir: str, first: int, aside: str) -> None:
    """Snapshots at index >= `first` go aside: they hold the diverged state,
    and must be neither restored nor sent to a follower."""
    root = snapshots_root(data_dir)
    if not os.path.isdir(root):
        return
    for name in sorted(os.listdir(root)):
        if name.isascii() and name.isdigit() and int(name) >= first:
            os.makedirs(os.path.join(aside, SNAPSHOTS_DIR), exist_ok=True)
            os.replace(os.path.join(root, name), os.path.join(aside, SNAPSHOTS_DIR, name))


def _copy_tail(commit_log: CommitLog, first: int, aside: str) -> None:
    """Copies of every segment and index file holding entries >= `first`."""
    if first > commit_log.last_index:
        return
    position = commit_log.read_entry(max(first, commit_log.first_index)).position
    segments = commit_log.segments
    assert segments is not None  # an open log has its segment files
    base = segments.base_of(position)
    os.makedirs(os.path.join(aside, "commitlog"), exist_ok=True)
    for b in segments.bases:
        if b >= base:
            shutil.copy2(segments.path(b), os.path.join(aside, "commitlog", os.path.basename(
                segments.path(b))))
    index_dir = os.path.join(commit_log.data_dir, "index")
    if os.path.isdir(index_dir):
        shutil.copytree(index_dir, os.path.join(aside, "index"), dirs_exist_ok=True)
