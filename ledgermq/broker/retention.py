"""Retention: which CommitLog segments go, agreed through the log, and the
disk watermarks that protect a broker's disk.

Four parts, one per question:

- **Where may the log start?** The leader runs the policy
  (`broker.retention_policy.trim_point`: age, size, soft disk watermark,
  held back by the newest snapshot and the last segment) and proposes its
  answer, a segment base, as a `log.trim` CONTROL op, so every replica
  learns the same point at the same place of the log (`BrokerState.trim`
  keeps the highest).
- **What may this replica delete now?** Every replica, leader or not,
  deletes whole segments below `min(state.trim, its newest local snapshot's
  end, its ConsumeQueue checkpoint's dispatched_end)`: below the agreed point
  only, so replicas stay byte-identical over what they both keep; covered by
  a local snapshot, so a restart can rebuild the state without them; and
  indexed durably by the ConsumeQueues, so their recovery never needs a
  deleted entry. ConsumeQueue files wholly below the new first position go
  with them.
- **How far ahead must it look?** Deletion is by passes, so a node's disk
  peaks just before one. To keep `retention_bytes` a ceiling rather than a
  level the log overshoots by what arrives between passes, every pass
  measures how much the log grew from the previous pass's decision to its
  own deletions, and the policy cuts the most of the recent such growths
  below `retention_bytes` (`TrimDecision.headroom`).
- **May this broker take more messages?** Above `disk_hard_ratio` the leader
  refuses SEND_MESSAGES with DISK_FULL (control operations, offset commits
  and trims still pass: they free space or are tiny), counts the refusal and
  logs the crossing once.

Passes run every `retention_interval_ms`, and also whenever one can delete
more (`note_applied`, after every applied batch): on the leader when its log
starts a new segment while a size limit is set (the size rule's answer only
changes then, so the log overshoots by about one segment, not by an
interval's writes at full speed); on every replica when a `log.trim` raises
the agreed point (a follower deletes with its leader, not at its own next
interval). When a replica's own snapshot is what holds deletion back (the
policy's limit on the leader, the local bound on any replica) it writes one
at once rather than waiting for the snapshot schedule; when its ConsumeQueue
checkpoint is (the server writes one every `cq_checkpoint_interval_ms`), it
looks again one checkpoint interval later rather than a retention interval.

The CommitLog and ConsumeQueues belong to the event loop (they are not
thread-safe), so deletions run there, one segment per step with a yield in
between; what only reads files (disk usage, snapshot metadata, the
ConsumeQueue checkpoint) runs on a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from commitlog import HEADER_SIZE, KIND_MESSAGES, CorruptionError, StorageError
from commitlog.segments import SegmentInfo
from commitlog.snapshot import SnapshotInfo, scan_snapshots
from consumequeue import ConsumeQueueStore
from consumequeue.checkpoint import read_dispatch_checkpoint
from ledgermq.base.clock import now_ms
from ledgermq.base.errors import DiskFullError, InvalidRequestError, LedgerMQError
from ledgermq.base.message_record import MESSAGE_HEAD
from ledgermq.base.tasks import cancel_and_wait
from ledgermq.broker.config import BrokerConfig
from ledgermq.broker.control import log_trim
from ledgermq.broker.group_commit import GroupCommitter
from ledgermq.broker.retention_policy import (
    DiskUsage,
    RetentionSettings,
    TrimDecision,
    disk_usage,
    segment_floor,
    trim_point,
)
from ledgermq.broker.runtime import RaftRuntime
from ledgermq.broker.snapshots import SnapshotSchedule
from ledgermq.broker.state import BrokerState

log = logging.getLogger(__name__)

# The disk is sampled this often: the hard watermark must notice a filling
# disk within seconds, whatever the retention interval.
DISK_SAMPLE_SECONDS = 1.0
# Entries looked at, from either end of the log, to find the store time of
# the first and last retained message (GET /retention).
_TIME_SCAN_ENTRIES = 256
# Growths remembered for the headroom (the most of them is used): long enough
# to ride out a pass that happened to see a lull, short enough that a
# producer slowing down gives the disk back within a few intervals.
_GROWTH_WINDOW = 16


class RetentionHost(Protocol):
    """What retention needs of a started broker (`broker.view.BrokerView`
    has it all; a narrower Protocol keeps view -> retention acyclic)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def state(self) -> BrokerState:
        """The replicated state (replaced by a snapshot install: read it each time)."""

    @property
    def node(self) -> RaftRuntime: ...

    @property
    def cq(self) -> ConsumeQueueStore: ...

    @property
    def controls(self) -> GroupCommitter[dict[str, Any], int] | None: ...

    @property
    def snapshots(self) -> SnapshotSchedule: ...


@dataclass
class RetentionCounters:
    """What retention did on this node since the process started (metrics)."""

    segments_deleted: int = 0
    bytes_deleted: int = 0
    cq_files_deleted: int = 0
    trims_proposed: int = 0
    passes: int = 0
    failures: int = 0
    # Snapshots retention asked for because one was all deletion waited on.
    snapshots_requested: int = 0
    last_deleted_ms: int = 0
    writes_refused: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class LocalBound:
    """How far this replica may delete, and which input decided it."""

    position: int
    trim: int
    snapshot_end: int | None
    cq_checkpoint_end: int | None

    @property
    def held_by(self) -> str:
        """Which input is the bound: "trim" (the agreed point itself),
        "snapshot" or "consumequeue_checkpoint" (this replica lags behind it)."""
        if self.position >= self.trim:
            return "trim"
        if self.snapshot_end is None or self.position == self.snapshot_end:
            return "snapshot"
        return "consumequeue_checkpoint"

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position, "trim": self.trim,
                "snapshot_end": self.snapshot_end,
                "consumequeue_checkpoint_end": self.cq_checkpoint_end,
                "held_by": self.held_by}


class Retention:
    """Retention and the disk watermarks of one broker node.

    `start()` runs two tasks: a disk sampler (every second; it also wakes
    the retention pass when the disk crosses the soft watermark) and the
    retention pass (every `retention_interval_ms`): the leader proposes its
    trim point, then every replica deletes what its local bound allows.
    """

    def __init__(self, broker: RetentionHost) -> None:
        self.b = broker
        self.config = broker.config
        self.settings = RetentionSettings.from_config(broker.config)
        self.counters = RetentionCounters()
        self.disk: DiskUsage | None = None
        self.refusing = False
        self.last_decision: TrimDecision | None = None
        self.last_bound: LocalBound | None = None
        self._verified: SnapshotInfo | None = None
        self._blocked_at: int | None = None  # the wanted point last logged as blocked
        # The last log.trim this node proposed: position, why, entry, when.
        self.last_proposed: dict[str, Any] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._pass_lock = asyncio.Lock()
        # The headroom's measurements: the log's end when the previous pass
        # decided, and what it grew by from one decision to the next pass's
        # deletions (bytes, the newest last).
        self._decided_end: int | None = None
        self._decided_state: BrokerState | None = None
        self.growths: deque[int] = deque(maxlen=_GROWTH_WINDOW)
        self._trim_seen = broker.state.trim
        self._segment_seen = -1  # the segment the leader's log ended in at the last wake
        self._recheck: asyncio.TimerHandle | None = None  # after the next CQ checkpoint

    # ------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._disk_loop()),
                       asyncio.create_task(self._retention_loop())]

    async def stop(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
        await cancel_and_wait(self._tasks)
        self._tasks = []

    async def _disk_loop(self) -> None:
        while True:
            try:
                await self.sample_disk()
            except OSError as exc:
                log.error("cannot sample the disk usage of %s: %s", self.config.data_dir, exc)
            await asyncio.sleep(DISK_SAMPLE_SECONDS)

    async def _retention_loop(self) -> None:
        interval = self.config.retention_interval_ms / 1000
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failing disk or a bug: log it, keep trying
                self.counters.failures += 1
                log.error("retention pass failed: %r", exc)

    # ------------------------------------------------------------------ disk

    async def sample_disk(self) -> DiskUsage:
        """Sample the disk and update the hard-watermark refusal (logged on change)."""
        usage = await asyncio.to_thread(disk_usage, self.config.data_dir)
        self.note_disk(usage)
        return usage

    def note_disk(self, usage: DiskUsage) -> None:
        self.disk = usage
        ratio = usage.ratio
        refusing = ratio > self.settings.hard_ratio
        if refusing != self.refusing:
            self.refusing = refusing
            if refusing:
                log.error("disk usage %.1f%% of %s is above disk_hard_ratio %.0f%%: refusing"
                          " new messages (DISK_FULL) until retention frees space",
                          ratio * 100, self.config.data_dir, self.settings.hard_ratio * 100)
            else:
                log.warning("disk usage %.1f%% of %s is below disk_hard_ratio %.0f%% again:"
                            " accepting messages", ratio * 100, self.config.data_dir,
                            self.settings.hard_ratio * 100)
        if ratio > self.settings.soft_ratio:
            self._wake.set()  # delete early now rather than at the next interval

    def require_space(self) -> None:
        """Raise DiskFullError while the disk is above the hard watermark."""
        if not self.refusing:
            return
        refused = self.counters.writes_refused
        refused["disk_full"] = refused.get("disk_full", 0) + 1
        ratio = self.disk.ratio if self.disk is not None else 1.0
        raise DiskFullError(
            f"disk usage {ratio:.1%} of node {self.config.node_id}'s data directory is above"
            f" disk_hard_ratio {self.settings.hard_ratio:.0%}: new messages are refused until"
            " retention frees space", data={"usage_ratio": round(ratio, 6),
                                            "hard_ratio": self.settings.hard_ratio,
                                            "node_id": self.config.node_id})

    # ------------------------------------------------------------- one pass

    def note_applied(self) -> None:
        """After an applied batch: start a pass now if one could delete more
        than the last. A `log.trim` that raised the agreed point: every
        replica deletes with the leader rather than up to an interval later
        (on the leader the pass that proposed it deletes anyway; the extra
        pass finds little to do). A new segment on the leader under a size
        limit: the size rule may now drop the oldest one."""
        trim = self.b.state.trim
        if trim > self._trim_seen:
            self._trim_seen = trim
            self._wake.set()
        if self.settings.retention_bytes > 0 and self.b.node.leader_ready:
            # Segment bases are multiples of the segment size.
            segment = self.b.node.log.end // self.config.segment_size_bytes
            if segment != self._segment_seen:
                self._segment_seen = segment
                self._wake.set()

    @property
    def headroom(self) -> int:
        """Bytes the size rule keeps free below `retention_bytes`: the most
        the log grew between a decision and the next pass's deletions,
        over the last passes (0 before two passes were seen)."""
        return max(self.growths, default=0)

    async def run_once(self) -> int:
        """One retention pass: the leader proposes its trim point, then this
        replica deletes what its bound allows. Returns segments deleted."""
        async with self._pass_lock:
            if self.b.node.failed is not None:
                return 0  # a failed replica touches no file until it is restarted
            self.counters.passes += 1
            log_ = self.b.node.log
            decided_end, state = log_.end, self.b.state
            snapshot_end = await self._snapshot_end()
            if self.b.node.leader_ready:
                snapshot_end = await self._propose(snapshot_end)
            bound = await self.local_bound(snapshot_end)
            if self._snapshot_would_free(bound):
                # This replica's snapshot is all that keeps the agreed
                # segments: one at the applied index (past the trim entry,
                # so past the point) frees them now.
                snapshot_end = await self._snapshot_now()
                bound = await self.local_bound(snapshot_end)
            deleted = await self._delete_local(bound)
            self._note_growth(decided_end, state)
            if bound.held_by == "consumequeue_checkpoint" and self._frees_a_segment(bound.trim):
                self._recheck_after_checkpoint()
            return deleted

    def _recheck_after_checkpoint(self) -> None:
        """Run a pass again once the server's next ConsumeQueue checkpoint
        (every `cq_checkpoint_interval_ms`) may have moved past the point."""
        if self._recheck is not None:
            self._recheck.cancel()
        delay = self.config.cq_checkpoint_interval_ms / 1000
        self._recheck = asyncio.get_running_loop().call_later(delay, self._wake.set)

    def _frees_a_segment(self, position: int) -> bool:
        """Whether this replica holds a whole segment below `position`."""
        infos = self.b.node.log.segment_infos()
        return len(infos) >= 2 and infos[1].base <= position

    def _note_growth(self, decided_end: int, state: BrokerState) -> None:
        """Record how far the log grew from the previous pass's decision to
        now (this pass's deletions are done): the peak the next interval
        must leave room for. Not across an install (the state object was
        replaced and the log's end jumped rather than grew)."""
        previous, same = self._decided_end, self._decided_state is self.b.state
        if previous is not None and same:
            self.growths.append(max(0, self.b.node.log.end - previous))
        self._decided_end, self._decided_state = decided_end, state

    def _snapshot_would_free(self, bound: LocalBound) -> bool:
        """Whether the local bound stops short of the agreed point because of
        this replica's snapshot, and a snapshot now would free a segment."""
        if bound.held_by != "snapshot" or not self._frees_a_segment(bound.trim):
            return False
        return self._snapshot_would_move()

    def _snapshot_would_move(self) -> bool:
        """Whether a snapshot now would cover more than the newest one (and
        snapshots are on: a broker configured without them deletes nothing)."""
        schedule = self.b.snapshots
        latest = schedule.latest
        return schedule.enabled and (latest is None
                                     or latest.index < self.b.state.applied_index)

    async def _snapshot_now(self) -> int | None:
        """Write a snapshot at the applied index now; the newest end after it."""
        self.counters.snapshots_requested += 1
        try:
            await self.b.snapshots.snapshot_now()
        except Exception as exc:  # snapshot_now logs its own failures; be safe
            log.error("snapshot for retention failed: %r", exc)
        return await self._snapshot_end()

    async def snapshot(self) -> SnapshotInfo | None:
        """The newest local snapshot whose state verifies. Its CRC is checked
        once per snapshot, not at every pass (the state may be large). A
        directory being written or pruned meanwhile is simply not usable
        yet: the scan does not log it, as `latest_snapshot` at start-up does."""
        data_dir = self.config.data_dir
        scan = await asyncio.to_thread(scan_snapshots, data_dir)
        newest = scan.good[-1] if scan.good else None
        if newest is None or newest != self._verified:
            verified = await asyncio.to_thread(scan_snapshots, data_dir, True)
            self._verified = verified.good[-1] if verified.good else None
        return self._verified

    async def _snapshot_end(self) -> int | None:
        info = await self.snapshot()
        return info.end_position if info is not None else None

    def decide(self, snapshot_end: int | None) -> TrimDecision:
        """The policy's answer for this node's log now."""
        decision = trim_point(self.b.node.log.segment_infos(), snapshot_end, self.settings,
                              now_ms(), self.disk, self.headroom)
        self.last_decision = decision
        return decision

    async def _propose(self, snapshot_end: int | None) -> int | None:
        """Decide and propose the trim point; the snapshot end used (a newer
        one when the snapshot held the policy back and one was written)."""
        decision = self.decide(snapshot_end)
        if decision.blocked_by == "snapshot" and self._snapshot_would_move():
            # The snapshot schedule counts entries and bytes, not what
            # retention waits for: write one now rather than let the disk
            # grow until the schedule's next one.
            snapshot_end = await self._snapshot_now()
            decision = self.decide(snapshot_end)
        if decision.blocked_by == "snapshot" and decision.wanted != self._blocked_at:
            # Once per wanted point, not at every pass while it waits.
            self._blocked_at = decision.wanted
            log.info("retention wants the log to start at %d (%s) but the newest snapshot"
                     " ends at %s: waiting for a newer snapshot", decision.wanted,
                     ",".join(decision.reasons), snapshot_end)
        if decision.deletes and decision.position > self.b.state.trim:
            try:
                await self.propose_trim(decision.position, ",".join(decision.reasons))
            except LedgerMQError as exc:  # lost the lead, a slow commit: the next pass retries
                log.warning("log.trim at %d not proposed: %s", decision.position, exc)
        return snapshot_end

    async def propose_trim(self, position: int, why: str) -> int:
        """Propose `log.trim` at `position` through the log; its entry index."""
        controls = self.b.controls
        assert controls is not None, "the broker is started"
        index = await controls.submit(log_trim(position), 64)
        self.counters.trims_proposed += 1
        self.last_proposed = {"position": position, "reasons": why.split(","),
                              "entry": index, "ms": now_ms()}
        log.info("proposed log.trim at position %d (%s) in entry %d", position, why, index)
        return index

    async def local_bound(self, snapshot_end: int | None = None) -> LocalBound:
        """min(agreed trim, newest local snapshot's end, ConsumeQueue
        checkpoint's end). `snapshot_end`: the caller's snapshot end, if it
        just looked (else this looks)."""
        if snapshot_end is None:
            snapshot_end = await self._snapshot_end()
        try:
            checkpoint = await asyncio.to_thread(read_dispatch_checkpoint, self.b.cq.directory)
        except CorruptionError as error:
            # Damaged since the start: the bound falls to 0 (nothing is
            # deleted) until the next checkpoint (cq_checkpoint_interval_ms)
            # replaces it.
            log.warning("retention: %s", error)
            checkpoint = None
        cq_end = checkpoint.dispatched_end if checkpoint is not None else None
        trim = self.b.state.trim
        position = min(trim, snapshot_end if snapshot_end is not None else 0,
                       cq_end if cq_end is not None else 0)
        bound = LocalBound(position, trim, snapshot_end, cq_end)
        self.last_bound = bound
        return bound

    async def _delete_local(self, bound: LocalBound) -> int:
        log_ = self.b.node.log
        deleted = 0
        # One segment per step: each step unlinks a file and rewrites the
        # checkpoint on the loop, so others run in between.
        while True:
            infos = log_.segment_infos()
            if len(infos) < 2 or infos[1].base > bound.position:
                break
            first = infos[0]
            try:
                if not log_.delete_before(infos[1].base):
                    break  # beyond what is durable yet
            except (OSError, StorageError) as exc:
                self.counters.failures += 1
                log.error("deleting segment %d failed: %s", first.base, exc)
                break
            deleted += 1
            self.counters.segments_deleted += 1
            self.counters.bytes_deleted += first.length
            self.counters.last_deleted_ms = now_ms()
            # In the same step: no pull may find a queue unit pointing into
            # the segment just deleted (min_offset moves past them now).
            self._trim_queues()
            await asyncio.sleep(0)
        infos = self._trim_queues()
        if deleted:
            log.info("retention deleted %d segment(s); the log now starts at index %d"
                     " (position %d)", deleted, log_.first_index,
                     infos[0].base if infos else 0)
        return deleted

    def _trim_queues(self) -> list[SegmentInfo]:
        """ConsumeQueue files below the log's first position go, and every
        queue's min_offset moves to its first unit at or after it. The
        segment infos, for the caller."""
        infos = self.b.node.log.segment_infos()
        if infos:
            self.counters.cq_files_deleted += self.b.cq.delete_before(infos[0].base)
        return infos

    def log_bytes(self) -> int | None:
        """Bytes of CommitLog segments and index files; None when the disk
        refuses (counting flushes pending index records, which a full disk
        fails): a status or a scrape must still answer then."""
        try:
            return self.b.node.log.disk_bytes()
        except (OSError, StorageError) as exc:
            log.warning("cannot count the CommitLog's bytes: %s", exc)
            return None

    # --------------------------------------------------------- manual trim

    def position_of_index(self, index: int) -> int:
        """The base of the segment holding entry `index` (clamped to the
        applied entries: the point never runs ahead of what this node knows)."""
        log_ = self.b.node.log
        upto = min(index, self.b.state.applied_index, log_.last_index)
        if upto < log_.first_index:
            return log_.segment_infos()[0].base if log_.segment_infos() else 0
        entry = log_.read_entries(upto, upto + 1, 1)[0]
        return segment_floor(entry.position, self.config.segment_size_bytes)

    async def manual_trim(self, *, index: int | None = None, position: int | None = None,
                          dry_run: bool = False) -> dict[str, Any]:
        """An operator's "delete up to": entries below `index` (or the bytes
        below `position`) may go, whole segments only, once snapshots cover
        them. Proposed as `log.trim` (the caller checked this is the leader).
        The point is clamped to the segment holding the last applied entry,
        so a typo cannot agree on deleting the future."""
        if (index is None) == (position is None):
            raise InvalidRequestError("give exactly one of 'index' and 'position'")
        value = index if index is not None else position
        assert value is not None
        if value < 0:
            raise InvalidRequestError("'index' and 'position' must not be negative")
        applied = self.b.state.applied_index
        ceiling = self.position_of_index(applied)
        if index is not None:
            wanted = self.position_of_index(index)
            clamped = index > applied
        else:
            wanted = segment_floor(value, self.config.segment_size_bytes)
            clamped = wanted > ceiling
        target = min(wanted, ceiling)
        previous = self.b.state.trim
        infos = self.b.node.log.segment_infos()
        covered = [s for s in infos[:-1] if s.base + self.config.segment_size_bytes <= target]
        entry: int | None = None
        if not dry_run and target > previous:
            entry = await self.propose_trim(target, "manual")
        answer: dict[str, Any] = {
            "requested": {"index": index} if index is not None else {"position": position},
            "position": target, "clamped": clamped, "previous_trim": previous,
            "trim": max(previous, target) if not dry_run else previous, "dry_run": dry_run,
            "proposed_in_entry": entry, "segments": len(covered),
            "bytes": sum(s.length for s in covered)}
        if not dry_run:
            # Delete at once what this node's own bound already allows.
            self._wake.set()
        bound = await self.local_bound()
        answer["waiting_for"] = (bound.held_by if bound.position < max(previous, target)
                                 else None)
        return answer

    # ------------------------------------------------------------- describe

    def _message_time(self, lo: int, hi: int, newest: bool) -> int | None:
        """Store time of the first (or last) MESSAGES entry in [lo, hi],
        looking at most _TIME_SCAN_ENTRIES entries from that end: per entry
        its index record, then only the first record's head is read (every
        record of an entry carries the leader's store time)."""
        log_ = self.b.node.log
        scan = (range(hi, max(lo, hi - _TIME_SCAN_ENTRIES + 1) - 1, -1) if newest
                else range(lo, min(hi, lo + _TIME_SCAN_ENTRIES - 1) + 1))
        for index in scan:
            record = log_.index.read(index)
            if record is None or record.kind != KIND_MESSAGES:
                continue
            head = log_.read_bytes(record.position + HEADER_SIZE, MESSAGE_HEAD.size)
            if len(head) == MESSAGE_HEAD.size:
                stamp: int = MESSAGE_HEAD.unpack_from(head, 0)[5]
                return stamp
        return None

    async def describe(self) -> dict[str, Any]:
        """GET /retention: settings, disk, retained range, snapshot, trim points."""
        b, cfg = self.b, self.config
        log_ = b.node.log
        disk = self.disk or await self.sample_disk()
        info = await self.snapshot()
        bound = await self.local_bound(info.end_position if info is not None else None)
        infos = log_.segment_infos()
        decision = self.decide(info.end_position if info is not None else None)
        applied = min(b.state.applied_index, log_.last_index)
        first = log_.first_index
        try:
            first_ms = self._message_time(first, applied, newest=False)
            last_ms = self._message_time(first, applied, newest=True)
        except (OSError, StorageError, IndexError, LedgerMQError) as exc:
            log.warning("cannot read the retained range's times: %r", exc)
            first_ms = last_ms = None
        c = self.counters
        return {
            "group": cfg.group, "node_id": f"n{cfg.node_id}", "role": b.node.role,
            "settings": {"retention_hours": cfg.retention_hours,
                         "retention_bytes": cfg.retention_bytes,
                         "disk_soft_ratio": cfg.disk_soft_ratio,
                         "disk_hard_ratio": cfg.disk_hard_ratio,
                         "retention_interval_ms": cfg.retention_interval_ms,
                         "segment_size_bytes": cfg.segment_size_bytes},
            "disk": {"path": cfg.data_dir, **disk.to_json(),
                     "refusing_writes": self.refusing, "log_bytes": self.log_bytes(),
                     "segments": len(infos)},
            "retained": {"first_index": first, "last_index": log_.last_index,
                         "applied_index": applied,
                         "first_position": infos[0].base if infos else 0,
                         "end_position": log_.end,
                         "first_time_ms": first_ms, "last_time_ms": last_ms},
            "snapshot": None if info is None else {
                "index": info.index, "term": info.term, "end_position": info.end_position,
                "created_ms": info.created_ms},
            "trim": {"agreed_position": b.state.trim, "local_bound": bound.to_json(),
                     "policy": decision.to_json(), "last_proposed": self.last_proposed},
            "deleted": {"segments": c.segments_deleted, "bytes": c.bytes_deleted,
                        "consumequeue_files": c.cq_files_deleted,
                        "last_ms": c.last_deleted_ms or None},
            "writes_refused": dict(c.writes_refused),
            "snapshots_requested": c.snapshots_requested,
        }
