"""The leader's view of one follower: match/next index, probe/replicate/snapshot state, window.

    +--------+  append accepted   +-----------+
    | PROBE  | -----------------> | REPLICATE |
    |        | <----------------- |           |
    +--------+  rejection, or no  +-----------+
      |    ^    progress within         ^
      |    |    resend_ticks            |
      |    | snapshot_timeout_ticks,    | ack at or past
      |    | report_snapshot(False)     | pending_snapshot
      v    |                            |
    +----------+                        |
    | SNAPSHOT | -----------------------+
    +----------+

PROBE sends one append at a time (waiting for the answer) to find where the
logs agree. REPLICATE streams: `next` moves optimistically past each batch
sent, up to `inflight_max` unanswered batches (the pipelining window).
SNAPSHOT: the entries the follower needs are gone from the leader's log, an
`InstallSnapshot` of `pending_snapshot` is on its way; nothing else is sent
until the follower acknowledges it, or the attempt times out or fails and the
follower is probed again (which sends a new snapshot if still needed).
"""

from __future__ import annotations

import enum
from collections import deque


class ProgressState(enum.IntEnum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


class Progress:
    """Invariant: 0 <= match < next."""

    __slots__ = (
        "directory_id",
        "inflight",
        "inflight_max",
        "match",
        "next",
        "pending_snapshot",
        "probe_sent",
        "recent_active",
        "snapshot_ticks",
        "stall_ticks",
        "state",
    )

    def __init__(self, next_index: int, inflight_max: int) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        # PROBE: an append is outstanding; cleared by its answer or a heartbeat answer.
        self.probe_sent = False
        # REPLICATE: last index of each unanswered batch, oldest first.
        self.inflight: deque[int] = deque()
        self.inflight_max = inflight_max
        # Heard from this follower since the last leader check (preferred leader health).
        self.recent_active = False
        # Ticks with batches in flight and no accepted answer: a lost batch
        # would otherwise stall a full window forever.
        self.stall_ticks = 0
        # SNAPSHOT: index of the snapshot sent, and ticks since it was sent.
        self.pending_snapshot = 0
        self.snapshot_ticks = 0
        # Data-directory id the follower last answered from (0: none heard).
        self.directory_id = 0

    def paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.SNAPSHOT:
            return True
        return len(self.inflight) >= self.inflight_max

    def become_probe(self) -> None:
        self._reset(ProgressState.PROBE)
        self.next = self.match + 1

    def become_replicate(self) -> None:
        self._reset(ProgressState.REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, index: int) -> None:
        """An `InstallSnapshot` of `index` went out: pause until it is acknowledged."""
        self._reset(ProgressState.SNAPSHOT)
        self.pending_snapshot = index
        self.next = max(self.match, index) + 1

    def snapshot_done(self) -> bool:
        """SNAPSHOT and the follower now matches at or past the snapshot."""
        return self.state is ProgressState.SNAPSHOT and self.match >= self.pending_snapshot

    def _reset(self, state: ProgressState) -> None:
        self.state = state
        self.probe_sent = False
        self.inflight.clear()
        self.stall_ticks = 0
        self.pending_snapshot = 0
        self.snapshot_ticks = 0

    def sent(self, last_index: int) -> None:
        """An append ending at `last_index` went out."""
        if self.state is ProgressState.REPLICATE:
            if last_index >= self.next:
                self.next = last_index + 1
                self.inflight.append(last_index)
        else:
            self.probe_sent = True

    def update(self, index: int) -> bool:
        """The follower matches up to `index`; False if the answer is stale."""
        if index <= self.match:
            return False
        self.match = index
        self.next = max(self.next, index + 1)
        self.probe_sent = False
        self.stall_ticks = 0
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        return True

    def lost_tail(self, last_index: int) -> None:
        """The follower says its log ends at `last_index`, below `match`: it
        lost acknowledged entries. Probe it from its real end."""
        self.match = min(self.match, max(last_index, 0))
        self.become_probe()

    def decrease(self, rejected: int, match_hint: int) -> bool:
        """The follower rejected an append at prev_index `rejected`; False if stale.

        A reject whose hint lies below `match` says the follower no longer
        holds entries it acknowledged: it lost its unsynced tail (a power cut
        under flush=async) or the answer is an old one overtaken by later acks.
        Either way the safe move is to believe it: `match` drops to the hint
        and the follower is probed from there (lowering `match` can only delay
        a commit, never undo one). Ignoring it would probe at `match + 1`
        forever while the follower, whose log ends lower, rejects every time.
        """
        if self.state is ProgressState.SNAPSHOT:
            return False  # a rejected append sent before the snapshot: wait for its answer
        if self.state is ProgressState.REPLICATE:
            if rejected < self.match:
                return False  # answer to a request older than the last ack
            self.become_probe()
        elif self.next - 1 != rejected:
            return False  # not the probe we are waiting for
        if match_hint < self.match:
            self.match = max(match_hint, 0)
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.probe_sent = False
        return True
