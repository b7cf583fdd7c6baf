"""The broker process: one node of a Raft-replicated broker group.

Composes the Raft node runtime (`dledger.runtime.node`, whose log is the CommitLog),
the ConsumeQueues, the replicated state machine (`broker.state`) and the
client protocol (`broker.handlers`). Everything a replica must agree on —
messages, topics, consumer offsets, producer sequences — goes through the log;
membership (client heartbeats) and long-poll waiters are local and soft.

Start-up restores the newest usable broker-state snapshot (`broker.snapshots`
writes them), replays only the committed log after it into the state machine
and brings the ConsumeQueues up to the same point *before* the node starts,
so the node hands `apply` only what came after (`node.start(applied_index)`).
A follower sent a snapshot by its leader resets its state and rebuilds its
ConsumeQueues from it (`_on_install`).

The runtime is reached through `broker.runtime.RaftRuntime`; the handlers,
admin app and metrics see this broker as a `broker.view.BrokerView`. With an
admin listener, metrics are fed through explicit observer calls: the
runtime, its Flusher and `_flush_sends` report to `broker.metrics.Instruments`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import struct
import time
from collections.abc import Coroutine, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from commitlog import HEADER_SIZE, KIND_CONTROL, KIND_MESSAGES, CommitLogConfig, Entry, StorageError
from commitlog.columns import RecordColumns, queue_groups, scan_body
from commitlog.snapshot import SnapshotInfo, list_snapshots, read_state
from consumequeue import ConsumeQueueStore
from dledger.log import CommittedDivergence
from dledger.runtime.identity import Opened, open_identity
from dledger.runtime.node import (
    ApplyRest,
    NodeConfig,
    ProposalUnknown,
    RaftGroupNode,
    SoftStateInfo,
)
from dledger.runtime.node import NotLeaderError as RuntimeNotLeaderError
from dledger.runtime.transport import tls_contexts
from ledgermq.base.clock import now_ms
from ledgermq.base.errors import (
    NotLeaderError,
    OutcomeUnknownError,
    RequestTimeoutError,
    ServiceUnavailableError,
)
from ledgermq.base.tasks import cancel_and_wait
from ledgermq.broker import rollback
from ledgermq.broker.admin_http import BrokerAdmin
from ledgermq.broker.codec import Records
from ledgermq.broker.config import BrokerConfig, split_address
from ledgermq.broker.control import encode_control
from ledgermq.broker.group_commit import GroupCommitter, Pending
from ledgermq.broker.handlers import handlers_for
from ledgermq.broker.keys import BrokerSecurity
from ledgermq.broker.longpoll import LongPoll
from ledgermq.broker.members import Membership
from ledgermq.broker.metrics import Instruments
from ledgermq.broker.queue_repair import QueueRepairs
from ledgermq.broker.registrar import Registrar
from ledgermq.broker.retention import Retention
from ledgermq.broker.runtime import RaftRuntime, RuntimeFactory
from ledgermq.broker.snapshots import SnapshotSchedule
from ledgermq.broker.state import AppliedRecords, BrokerState, SnapshotFormatError
from ledgermq.broker.view import NO_BROKER_OBSERVER, BrokerObserver, ControlOp, SendAck
from ledgermq.wire import RpcServer
from ledgermq.wire.auth import KeyStore

log = logging.getLogger(__name__)

_STAMP = struct.Struct("<q")

# Results of applied MESSAGES entries are kept this long (in entries) for the
# proposer to pick up; far more than can be in flight at once.
_RESULTS_KEPT = 4096
_PRESCANNED_KEPT = 64  # proposals in flight at most (max_inflight_proposals is far lower)


async def _bounded(step: Coroutine[Any, Any, Any] | asyncio.Future[Any], seconds: float,
                   what: str, failures: list[Exception]) -> None:
    """Await one step of `Broker.stop`. Past `seconds` it is given up, and a
    storage error (a failing disk: the log is crash-safe without the step) is
    logged; any other error is logged and collected, for `stop` to raise
    after the rest."""
    try:
        async with asyncio.timeout(seconds):
            await step
    except TimeoutError:
        log.error("stopping the %s took more than %g s; going on without it", what, seconds)
    except (OSError, StorageError) as exc:
        log.error("stopping the %s failed on storage: %r", what, exc)
    except Exception as exc:
        log.error("stopping the %s failed: %r", what, exc)
        failures.append(exc)


class NoUsableSnapshotError(StorageError):
    """The CommitLog starts after entry 1 (retention or an install removed
    its head) and no snapshot on disk can stand in for the missing entries."""


class Broker:
    """One broker node. `runtime` builds its Raft replica (`RaftGroupNode`
    by default; tests may pass their own)."""

    def __init__(self, config: BrokerConfig, runtime: RuntimeFactory = RaftGroupNode) -> None:
        self.config = config
        # Secret files and the start-up rule first: a broker that would run
        # open off loopback refuses here, before anything is bound or written.
        self.security = BrokerSecurity.load(config)
        self.runtime = runtime
        self.state = BrokerState(config.dedup_window, config.dedup_producers_max)
        self.longpoll = LongPoll()
        self.queue_repairs = QueueRepairs()
        self.members = Membership(config.member_expiry_ms)
        self._node: RaftRuntime | None = None
        self.identity: Opened | None = None  # the data directory's, from start()
        self._cq: ConsumeQueueStore | None = None
        self._snapshots: SnapshotSchedule | None = None
        # What the last start did: the snapshot it restored, the entries it
        # replayed after it and how long that took (status()["recovery"]).
        self.recovery: dict[str, Any] = {}
        self.rpc: RpcServer | None = None
        # Metrics exist with the admin app that serves them; the runtime, its
        # Flusher and the send path report to them from the start.
        self.instruments = (Instruments(config.group, config.node_id) if config.admin_listen
                            else None)
        self.observer: BrokerObserver = self.instruments or NO_BROKER_OBSERVER
        self.address: tuple[str, int] | None = None
        self.registrar = Registrar(config.namesrv, self.registration,
                                   config.namesrv_register_interval_ms / 1000,
                                   f"{config.group}/n{config.node_id}",
                                   credentials=self.security.cluster,
                                   tls=self.security.namesrv_tls)
        self._results: dict[int, AppliedRecords] = {}
        # id(entry body) -> (body, its columns) for bodies this leader proposed.
        self._prescanned: dict[int, tuple[bytes, RecordColumns]] = {}
        self._apply_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._cq_checkpointing: asyncio.Future[bool] | None = None
        self._topics_version_seen = 0
        self._last_role: str | None = None
        # Sends held while an election runs (wait_writable), woken by the
        # next soft-state change.
        self._soft_waiters: set[asyncio.Future[None]] = set()
        self.sends: GroupCommitter[Records, SendAck] | None = None
        self.controls: GroupCommitter[ControlOp, int] | None = None
        self.entry_limit = 0
        self.admin: BrokerAdmin | None = None  # when admin_listen is set
        self.retention: Retention | None = None  # from start()
        # Whose proofs and signatures the client port and the admin app accept
        # (None: authentication off): the cluster key, the bootstrap admin and
        # the users of the replicated ACL.
        self.keystore: KeyStore | None = self.security.keys
        if self.security.keys is not None:
            self.security.keys.users = self.state.acl.lookup
        # Set when the node asks for this process to restart (a rollback after
        # a committed divergence, see broker/rollback.py); `serve` obeys it.
        self.restart_requested = asyncio.Event()
        self.rolled_back: rollback.Rollback | None = None
        self.advertised = config.client_address
        if split_address(config.client_address)[0] in ("0.0.0.0", "::"):
            # Listening on every interface (a container): clients must be told
            # the address this node has in [peers], not the wildcard.
            self.advertised = config.peers[config.node_id].client

    @property
    def node(self) -> RaftRuntime:
        if self._node is None:
            raise RuntimeError("broker not started")
        return self._node

    @property
    def cq(self) -> ConsumeQueueStore:
        if self._cq is None:
            raise RuntimeError("broker not started")
        return self._cq

    @property
    def snapshots(self) -> SnapshotSchedule:
        if self._snapshots is None:
            raise RuntimeError("broker not started")
        return self._snapshots

    # ------------------------------------------------------------- lifecycle

    def _node_config(self) -> NodeConfig:
        c = self.config
        raft_host, _ = split_address(c.peers[c.node_id].raft)
        log_config = CommitLogConfig(
            segment_size_bytes=c.segment_size_bytes, flush=c.flush,
            flush_interval_ms=c.flush_interval_ms, flush_bytes=c.flush_bytes,
            page_cache_tail_bytes=c.page_cache_tail_bytes,
            message_size_bytes_max=c.message_size_bytes_max,
            entry_size_bytes_max=max(8 << 20, c.batch_max_bytes + (1 << 20)),
        )
        # The Raft port: peers prove the cluster secret to each other, over
        # TLS when the broker has a certificate (docs/raft.md).
        tls_server, tls_client = (tls_contexts(c.tls_cert_file, c.tls_key_file, c.tls_ca_file)
                                  if c.tls_cert_file else (None, None))
        return NodeConfig(
            cluster_secret=self.security.cluster.secret if self.security.cluster else b"",
            tls_server=tls_server, tls_client=tls_client,
            group=c.group, node_id=c.node_id, peers=c.raft_peers(), data_dir=c.data_dir,
            flush=c.flush, replicate=c.replicate, tick_ms=c.tick_ms,
            election_timeout_ticks=c.election_timeout_ticks,
            heartbeat_interval_ticks=c.heartbeat_interval_ticks,
            leader_lost_grace_ticks=c.leader_lost_grace_ticks,
            lost_leader_ticks=c.lost_leader_ticks,
            follower_apply_delay_ms=c.follower_apply_delay_ms, busy_poll_us=c.busy_poll_us,
            reserve_batch_entries=c.reserve_batch_entries,
            reserve_batch_bytes=c.reserve_batch_bytes,
            preferred_leader=c.preferred_leader, segment_size_bytes=c.segment_size_bytes,
            commitlog=log_config, bind_host=c.raft_bind_host or raft_host,
            initial_voters=frozenset(c.initial_members),
            client_addresses={nid: p.client for nid, p in c.peers.items()},
        )

    async def start(self) -> tuple[str, int]:
        """Recover, start the Raft node, then listen for clients."""
        c = self.config
        # The data directory's identity before anything else opens it: one of
        # another cluster or node, in a format this build does not read, or
        # with a damaged identity refuses the start here (IdentityError).
        self.identity = open_identity(c.data_dir, c.identity_cluster_id, c.node_id)
        node_config = replace(self._node_config(),
                              directory_id=self.identity.identity.directory_id)
        done = rollback.apply_pending(c.data_dir, node_config.commitlog_config())
        if done is not None:
            self.rolled_back = done
        self._node = self.runtime(
            node_config, self._apply, on_soft_state=self._on_soft_state,
            on_failure=self._on_node_failure, observer=self.observer,
            **self._install_hook())
        log_ = self._node.log
        self.entry_limit = log_.config.entry_size_limit
        self._snapshots = SnapshotSchedule(
            c.data_dir, self._node, lambda: self.state, c.snapshot_interval_entries,
            c.snapshot_interval_bytes)
        applied = self._recover()
        self.sends = GroupCommitter(self._flush_sends, max_count=c.batch_max_messages,
                                    max_bytes=min(c.batch_max_bytes, self.entry_limit - 64),
                                    max_inflight=c.max_inflight_proposals)
        self.controls = GroupCommitter(self._flush_controls, max_count=4096,
                                       max_bytes=1 << 20, max_inflight=1)
        await self._node.start(applied)
        # With a cluster secret every client connection must authenticate.
        keys = self.security.keys
        self.rpc = RpcServer(f"broker {c.group}/n{c.node_id}", handlers_for(self),
                             limits=c.server_limits(), key_store=keys,
                             require_auth=keys is not None, ssl=self.security.client_tls,
                             busy_poll_s=c.busy_poll_us / 1e6)
        # Every request a handler runs is counted, the server's own PING included.
        self.rpc.observer = self.instruments
        host, port = split_address(c.client_address)
        self.address = await self.rpc.start(host, port)
        if port == 0:  # an ephemeral port (tests): advertise the one bound
            self.advertised = f"{host}:{self.address[1]}"
        self.registrar.start()
        self._tasks.append(asyncio.create_task(self._checkpoint_loop()))
        self.retention = Retention(self)
        self.retention.start()
        if self.instruments is not None:
            self.admin = BrokerAdmin(self, self.instruments)
            await self.admin.start()
            log.info("admin listening on %s", self.admin.url)
        return self.address

    def _install_hook(self) -> dict[str, Any]:
        """`on_install=` for a runtime that can install snapshots sent by its
        leader (a runtime without it never needs one)."""
        try:
            accepts = "on_install" in inspect.signature(self.runtime).parameters
        except (TypeError, ValueError):
            accepts = False
        return {"on_install": self._on_install} if accepts else {}

    def _recover(self) -> int:
        """Restore the newest usable snapshot, replay the committed log after
        it into the state machine, then open the ConsumeQueues and bring them
        to the same point. Returns the applied index the node starts from."""
        started = time.perf_counter()
        log_ = self.node.log
        applied = min(log_.load_hard_state().commit, log_.last_index)
        snapshot, rejected = self._restore_snapshot()
        if snapshot is None and log_.first_index > 1:
            raise NoUsableSnapshotError(
                f"{self.config.data_dir}: the CommitLog starts at entry {log_.first_index}"
                f" (earlier ones were deleted by retention or replaced by an install) and no"
                f" usable snapshot covers them ({len(rejected)} rejected: {'; '.join(rejected)});"
                " wipe the data directory to rejoin the group by snapshot install")
        applied = max(applied, self.state.applied_index)
        replayed = self._replay(self.state.applied_index + 1, applied)
        # The queues open knowing the deleted topics, so whatever their own
        # recovery rebuilds from the log skips the dead messages.
        self._cq = ConsumeQueueStore(self.config.data_dir, log_,
                                     skip_before=self.state.deleted_before)
        cq_dispatched = self._cq.dispatched_index
        if cq_dispatched > applied:  # dispatched entries were committed
            replayed += self._replay(applied + 1, cq_dispatched)
            applied = cq_dispatched
        self.state.applied_index = max(applied, self.state.applied_index)
        self._recover_queues(cq_dispatched, applied)
        self._topics_version_seen = self.state.topics_version
        # Without a snapshot the intervals count from the start of the log, so
        # a long log (written before snapshots existed) gets one at once.
        self.snapshots.start_from(snapshot)
        self.recovery = {
            "snapshot_index": snapshot.index if snapshot else 0,
            "snapshots_rejected": rejected, "replayed_entries": replayed,
            "applied_index": applied, "first_index": log_.first_index,
            "queues_rebuilt": len(self._cq.recovery.queues_rebuilt),
            "queue_checkpoint_damaged": self._cq.recovery.checkpoint_damaged,
            "seconds": round(time.perf_counter() - started, 4),
        }
        log.info("recovered: applied index %d from snapshot %d + %d replayed entries in %.3f s,"
                 " %d topics, %d queues", applied, self.recovery["snapshot_index"], replayed,
                 self.recovery["seconds"], len(self.state.topics), len(self._cq.queues))
        return applied

    def _restore_snapshot(self) -> tuple[SnapshotInfo | None, list[str]]:
        """Load the newest snapshot the log can continue from into
        `self.state`; older ones are the fallback when a newer one is damaged
        or does not match this log. (the snapshot, why each newer one was rejected)"""
        log_ = self.node.log
        rejected: list[str] = []
        for info in reversed(list_snapshots(self.config.data_dir)):
            problem = None
            if info.index < log_.first_index - 1:
                problem = f"entries {info.index + 1}..{log_.first_index - 1} are gone"
            elif info.index > log_.last_index:
                problem = f"the log ends at {log_.last_index}"
            elif info.index >= log_.first_index and (
                    log_.term_at(info.index) != info.term
                    or log_.entry_end(info.index) != info.end_position):
                problem = "the log holds another entry at its index"
            if problem is None:
                try:
                    self._adopt_state(BrokerState.from_snapshot(
                        read_state(info), self.config.dedup_window,
                        self.config.dedup_producers_max))
                except (StorageError, SnapshotFormatError) as exc:
                    problem = str(exc)
                else:
                    if self.state.applied_index != info.index:
                        problem = f"its state is at index {self.state.applied_index}"
            if problem is None:
                return info, rejected
            self._adopt_state(BrokerState(self.config.dedup_window,
                                          self.config.dedup_producers_max))
            log.warning("snapshot %s not used: %s", info.path, problem)
            rejected.append(f"{info.index}: {problem}")
        return None, rejected

    def _adopt_state(self, state: BrokerState) -> None:
        """Make `state` the broker's (at start-up or on an install)."""
        self.state = state
        if self.security.keys is not None:
            self.security.keys.users = state.acl.lookup

    def _replay(self, lo: int, hi: int) -> int:
        """Apply committed entries [lo, hi] to the state; how many."""
        log_ = self.node.log
        index, count = lo, 0
        while index <= hi:
            entries = log_.read_entries(index, hi + 1, 8 << 20)
            for entry in entries:
                self.state.apply(entry)
            count += len(entries)
            index = entries[-1].index + 1
        return count

    def _recover_queues(self, cq_dispatched: int, applied: int) -> None:
        """Bring the ConsumeQueues to `applied`, agreeing with the state.

        A topic deleted after the queues' checkpoint still has files holding
        its dead messages: they go, and the re-dispatch skips dead messages.
        A queue that still disagrees with the state's count (damaged files a
        rebuild without the deletions refilled, a lost queue directory) is
        rebuilt with the rest from the log: the state is the truth, since it
        came whole from a snapshot and the log after it."""
        state, cq, log_ = self.state, self.cq, self.node.log
        state.take_deleted()
        upto = min(applied, log_.last_index)
        if cq.recovery.needs_rebuild:
            # The log starts after what the queues hold (an install replaced
            # it), or their checkpoint is damaged: only the state's counts can
            # number the messages the log has.
            if cq.recovery.checkpoint_damaged:
                log.warning("%s; rebuilding every ConsumeQueue from the log",
                            cq.recovery.checkpoint_damaged)
            cq.rebuild(log_.first_index, upto, dict(state.queue_next), state.deleted_before)
            return
        for topic, index in state.deleted_before.items():
            if index > cq_dispatched:
                cq.drop_topic(topic, index)
        while cq.dispatched_index < upto:
            entries = log_.read_entries(cq.dispatched_index + 1, upto + 1, 4 << 20)
            cq.dispatch(entries, None, skip_before=state.deleted_before)
        wrong = sorted(key for key in set(state.queue_next) | set(cq.queues)
                       if state.queue_next.get(key, 0) != cq.offsets(*key)[1])
        if wrong:
            log.warning("ConsumeQueues %s disagree with the replicated counts; rebuilding them"
                        " from the log", wrong[:10])
            cq.rebuild(log_.first_index, upto, dict(state.queue_next), state.deleted_before)

    def _on_install(self, info: SnapshotInfo) -> None:
        """The runtime installed a snapshot sent by the leader: the log now
        holds [first_index, info.index] and the node resumes after it. The
        state becomes the snapshot's, the ConsumeQueues are rebuilt from the
        installed log with the snapshot's counts, and whatever belonged to
        the old state (results kept for proposers, scans) is forgotten."""
        started = time.perf_counter()
        state = BrokerState.from_snapshot(read_state(info), self.config.dedup_window,
                                          self.config.dedup_producers_max)
        self._adopt_state(state)
        log_ = self.node.log
        self.cq.rebuild(log_.first_index, info.index, dict(state.queue_next),
                        state.deleted_before)
        self._results.clear()
        self._prescanned.clear()
        self.snapshots.start_from(info)
        self.longpoll.notify_all()
        self._topics_version_seen = state.topics_version
        self.registrar.kick()
        self._wake_apply_waiters()
        log.info("installed the leader's snapshot at index %d (log %d..%d, %d topics) in %.3f s",
                 info.index, log_.first_index, log_.last_index, len(state.topics),
                 time.perf_counter() - started)

    async def stop(self) -> None:
        """Stop serving, then the node. Every step is bounded: a peer or client
        that never answers must not keep a stopping broker alive (the log is
        crash-safe, so giving up on a step loses nothing committed). Every
        step runs; storage errors are logged, and the first other error of a
        step is raised after the last step."""
        failures: list[Exception] = []
        await _bounded(cancel_and_wait(self._tasks), 10.0, "background tasks", failures)
        if self.retention is not None:
            await _bounded(self.retention.stop(), 10.0, "retention", failures)
        if self._cq_checkpointing is not None:
            await _bounded(asyncio.shield(self._cq_checkpointing), 10.0,
                           "ConsumeQueue checkpoint", failures)
        if self.admin is not None:
            await _bounded(self.admin.close(), 3.0, "admin HTTP app", failures)
        await _bounded(self.registrar.stop(), 3.0, "NameServer registrar", failures)
        if self.rpc is not None:
            await _bounded(self.rpc.close(grace=2.0), 5.0, "client listener", failures)
        for committer in (self.sends, self.controls):
            if committer is not None:
                await _bounded(committer.close(), 6.0, "group commit", failures)
        if self._snapshots is not None:
            await _bounded(self._snapshots.close(), 30.0, "snapshot write", failures)
        if self._cq is not None:
            try:
                self._cq.close()
            except (OSError, StorageError) as exc:
                log.error("ConsumeQueue close failed: %r", exc)
            except Exception as exc:
                log.error("ConsumeQueue close failed: %r", exc)
                failures.append(exc)
        if self._node is not None:
            await _bounded(self._node.stop(), 15.0, "Raft node", failures)
        if failures:
            raise failures[0]

    async def _checkpoint_loop(self) -> None:
        """Keep ConsumeQueue recovery short: checkpoint the dispatched point."""
        interval = self.config.cq_checkpoint_interval_ms / 1000
        last = -1
        while True:
            await asyncio.sleep(interval)
            if self.cq.dispatched_index != last:
                last = self.cq.dispatched_index
                try:
                    # The checkpoint must not claim entries the log could
                    # lose: have the Flusher sync them first, off the loop,
                    # instead of the checkpoint's own fsync on the loop.
                    for _ in range(3):  # dispatch may move on while we wait
                        if self.cq.dispatched_index <= self.node.log.durable_index:
                            break
                        await self.node.wait_durable(self.cq.dispatched_index)
                    # The queue files' fsync and the checkpoint file run on a
                    # thread too; stop() waits for one in flight before the
                    # final checkpoint, so two never write at once.
                    token = self.cq.begin_checkpoint()
                    self._cq_checkpointing = asyncio.ensure_future(
                        asyncio.to_thread(self.cq.run_checkpoint, token))
                    await asyncio.shield(self._cq_checkpointing)
                except (OSError, StorageError) as exc:
                    log.error("ConsumeQueue checkpoint failed: %s", exc)

    # ----------------------------------------------------------------- apply

    def _columns(self, entry: Entry) -> RecordColumns:
        """The entry body's columns: the request's scan when this leader built
        the body itself (the very same bytes object), else a fresh scan."""
        known = self._prescanned.pop(id(entry.body), None) if self._prescanned else None
        if known is not None and known[0] is entry.body:
            return known[1]
        return scan_body(entry.body)

    def _apply(self, entries: Sequence[Entry]) -> ApplyRest:
        """Committed entries, in order, exactly once (called by the node):
        the state now, for the answers the node gives next in its pass; the
        ConsumeQueues and whoever waits on them in the rest, which the node
        runs after those answers and before it applies anything else. The
        rest first writes the answers (`RpcServer.flush_answers`), so that
        the senders go on while this node indexes what they sent. No request
        that reads the queues runs in between: the handlers that read them
        are coroutines, started in tasks (docs/architecture.md, "The answer
        before the queue writes")."""
        touched: set[tuple[str, int]] = set()
        keep = self._node is not None and self._node.role == "leader"
        # Each MESSAGES body is scanned once, for the state and the queues.
        scanned = [self._columns(e) if e.kind == KIND_MESSAGES else None for e in entries]
        state = self.state
        for entry, columns in zip(entries, scanned, strict=True):
            stored = state.apply(entry, columns)
            if columns is not None:
                touched.update(key for key, _ in queue_groups(columns))
                if keep and isinstance(stored, AppliedRecords):
                    self._results[entry.index] = stored
        return partial(self._apply_rest, entries, scanned, touched)

    def _apply_rest(self, entries: Sequence[Entry], scanned: Sequence[RecordColumns | None],
                    touched: set[tuple[str, int]]) -> None:
        if self.rpc is not None:
            self.rpc.flush_answers()
        self._dispatch(entries, scanned)
        if len(self._results) > _RESULTS_KEPT:
            for index in list(self._results)[: len(self._results) - _RESULTS_KEPT]:
                del self._results[index]
        if touched:
            self.longpoll.notify(touched)
        if self.state.topics_version != self._topics_version_seen:
            self._topics_version_seen = self.state.topics_version
            self.registrar.kick()
        self._wake_apply_waiters()
        self.snapshots.note_applied()
        if self.retention is not None:  # a raised trim point: delete now
            self.retention.note_applied()

    def _dispatch(self, entries: Sequence[Entry],
                  scanned: Sequence[RecordColumns | None]) -> None:
        """Index applied entries in the ConsumeQueues. A topic deleted by one
        of them loses its queue files first; its messages in entries before
        the deletion (in this batch too) are not indexed (`deleted_before`)."""
        state = self.state
        for topic in state.take_deleted():
            freed = self.cq.drop_topic(topic, state.deleted_before[topic])
            log.info("topic %r deleted at index %d: its ConsumeQueues dropped (%d bytes)",
                     topic, state.deleted_before[topic], freed)
        self.cq.dispatch(entries, scanned, skip_before=state.deleted_before)

    def _wake_apply_waiters(self) -> None:
        if self._apply_waiters:
            applied = self.state.applied_index
            still = []
            for index, future in self._apply_waiters:
                if index <= applied:
                    if not future.done():
                        future.set_result(None)
                else:
                    still.append((index, future))
            self._apply_waiters = still

    async def wait_applied(self, index: int, timeout: float) -> None:
        if self.state.applied_index >= index:
            return
        future = asyncio.get_running_loop().create_future()
        self._apply_waiters.append((index, future))
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            raise RequestTimeoutError(f"entry {index} not applied within {timeout:g}s") from None

    def _on_soft_state(self, info: SoftStateInfo) -> None:
        waiters, self._soft_waiters = self._soft_waiters, set()
        for future in waiters:
            if not future.done():
                future.set_result(None)
        role = info.role
        if role != self._last_role:
            log.info("role %s -> %s (term %s, leader %s)", self._last_role, role,
                     info.term, info.leader_id)
            self._last_role = role
            if role != "leader":
                self._results.clear()
                self._prescanned.clear()
        self.registrar.kick()
        if role == "leader":
            self._tasks = [t for t in self._tasks if not t.done()]
            self._tasks.append(asyncio.create_task(self._register_when_ready()))

    async def _register_when_ready(self) -> None:
        """Clients are sent to a leader only once it can serve writes."""
        with contextlib.suppress(Exception):
            await self.node.wait_leader_ready(30.0)
        self.registrar.kick()

    def _on_node_failure(self, exc: BaseException) -> None:
        """The node stopped. A committed divergence under `on_divergence =
        "rollback"` becomes a rollback at the next start and a restart now;
        anything else leaves the node failed (status and metrics say why)."""
        if not isinstance(exc, CommittedDivergence):
            return
        if self.config.divergence_action != "rollback":
            log.error("committed divergence; on_divergence=stop: this replica stays failed "
                      "until an operator repairs it: %s", exc)
            return
        try:
            rollback.request_rollback(self.config.data_dir, exc.index, str(exc))
        except OSError as err:
            log.error("cannot record the rollback (%s); staying failed", err)
            return
        log.warning("committed divergence at index %d: restarting to roll back onto the "
                    "group's log", exc.index)
        self.restart_requested.set()

    # ----------------------------------------------------------- leadership

    def leader_client_address(self) -> str | None:
        leader = self._node.leader_id if self._node is not None else None
        if not leader:
            return None
        # A node added after this one started is not in its [peers]: the
        # configuration carries its client address.
        member = self._node.membership.member(leader) if self._node is not None else None
        if member is not None and member.client_address:
            return member.client_address
        return self.config.client_address_of(leader)

    def writable(self) -> bool:
        """Writes go to the leader of this term, once its no-op is applied
        (the one condition; `require_writable` says why not)."""
        return self.node.leader_ready

    def require_writable(self) -> None:
        """Raise, saying why, unless `writable()`."""
        if self.writable():
            return
        node = self.node
        if node.failed is not None:
            raise ServiceUnavailableError(
                f"node {self.config.node_id} of {self.config.group} has failed and takes no"
                f" writes: {node.failed!r}")
        if node.role != "leader":
            leader = self.leader_client_address()
            raise NotLeaderError(
                f"node {self.config.node_id} of {self.config.group} is {node.role};"
                f" the leader is {leader or 'unknown'}", leader=leader)
        raise ServiceUnavailableError(
            f"node {self.config.node_id} leads term {node.term} but has not applied"
            " its first entry yet; retry shortly")

    async def wait_writable(self) -> None:
        """`require_writable`, but a write that arrives while no leader is
        known (an election is running) or while this node leads and has not
        applied its first entry yet waits for that to change, up to
        `write_hold_ms`, instead of being refused at once: the answer then
        names the new leader, or this node takes the write itself. A client
        retrying on NOT_LEADER hints thus learns of the new leader when the
        group does, without polling through the election."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.write_hold_ms / 1000
        while True:
            try:
                self.require_writable()
                return
            except NotLeaderError as exc:
                if exc.leader is not None:
                    raise  # a leader elsewhere: the client goes there now
                leaderless = True
            except ServiceUnavailableError:
                node = self.node
                if node.failed is not None or node.role != "leader":
                    raise
                leaderless = False
            remaining = deadline - loop.time()
            if remaining <= 0 or self.node.failed is not None:
                self.require_writable()  # raises the current answer
                return
            if leaderless:
                future: asyncio.Future[None] = loop.create_future()
                self._soft_waiters.add(future)
                try:
                    async with asyncio.timeout(remaining):
                        await future
                except TimeoutError:
                    pass
                finally:
                    self._soft_waiters.discard(future)
            else:
                await self.node.wait_leader_ready(remaining)

    async def propose(self, kind: int, body: bytes) -> Entry:
        """Propose one entry through the runtime; the appended entry once acked."""
        try:
            return await self.node.propose(
                kind, body, timeout=self.config.propose_timeout_ms / 1000)
        except (RuntimeNotLeaderError, ProposalUnknown, TimeoutError) as exc:
            raise self._client_error(exc) from None

    def _client_error(self, exc: Exception) -> Exception:
        """A runtime's proposal error as a client is answered with."""
        if isinstance(exc, RuntimeNotLeaderError):
            leader = self.config.client_address_of(exc.leader_id) if exc.leader_id else None
            return NotLeaderError(f"leadership lost: {exc}", leader=leader)
        if isinstance(exc, (ProposalUnknown, TimeoutError)):
            return OutcomeUnknownError(
                f"the write may or may not be stored ({type(exc).__name__}: {exc});"
                " retry with the same producer id and sequence")
        return exc

    # ------------------------------------------------------------ group commit

    def _flush_sends(self, batch: list[Pending[Records, SendAck]]) -> None:
        """One MESSAGES entry for every send request in `batch`; each request
        gets its `SendAck` (or the error) from the proposal's completion, in
        the node's pass that committed it: no task, no loop hop."""
        self.observer.send_batch(sum(p.count for p in batch))
        stamp = now_ms()
        pack = _STAMP.pack_into
        if len(batch) == 1:
            body = bytearray(batch[0].payload.blob)
        else:
            body = bytearray().join([p.payload.blob for p in batch])
        at = 0
        for pending in batch:
            # The store timestamp is the leader's clock when the entry is built.
            for start in pending.payload.starts:
                pack(body, at + start + 24, stamp)
            at += len(pending.payload.blob)
        data = bytes(body)
        columns = batch[0].payload.columns if len(batch) == 1 else None
        if columns is not None:
            # The apply of this very body can reuse the request's scan (the
            # store timestamps differ, and no column holds them).
            if len(self._prescanned) >= _PRESCANNED_KEPT:
                self._prescanned.clear()
            self._prescanned[id(data)] = (data, columns)
        try:
            self.node.propose_then(KIND_MESSAGES, data, partial(self._sends_proposed, batch),
                                   timeout=self.config.propose_timeout_ms / 1000)
        except RuntimeNotLeaderError as exc:
            raise self._client_error(exc) from None

    def _sends_proposed(self, batch: list[Pending[Records, SendAck]], entry: Entry | None,
                        error: BaseException | None) -> None:
        """A send batch's proposal ended: every request's `SendAck`, or the error."""
        assert self.sends is not None
        try:
            if error is None:
                assert entry is not None
                self._answer_sends(batch, entry)
        finally:
            answer = (self._client_error(error) if isinstance(error, Exception) else error)
            self.sends.finish(batch, answer)

    def _answer_sends(self, batch: list[Pending[Records, SendAck]], entry: Entry) -> None:
        # replicate=async answers at the leader's local persist, before commit
        # (even when, on a one-node group, the commit happened to be immediate).
        stored = self._results.pop(entry.index, None)
        if self.config.replicate == "async":
            stored = None
        at = entry.position + HEADER_SIZE
        k = 0
        for pending in batch:
            pending.resolve(SendAck(at, stored, k))
            at += len(pending.payload.blob)
            k += len(pending.payload.starts)

    async def _flush_controls(self, batch: list[Pending[ControlOp, int]]) -> None:
        """One CONTROL entry for every control operation in `batch`."""
        entry = await self.propose(KIND_CONTROL, encode_control([p.payload for p in batch]))
        await self.wait_applied(entry.index, self.config.propose_timeout_ms / 1000)
        for pending in batch:
            pending.resolve(entry.index)

    # ------------------------------------------------------------ NameServer

    def registration(self) -> dict[str, Any]:
        node = self._node
        role = "follower"
        if node is not None:
            if node.role == "leader":
                role = "leader" if node.leader_ready else "candidate"
            elif node.role in ("candidate", "precandidate", "pre_candidate"):
                role = "candidate"
        return {
            "cluster": self.config.cluster, "group": self.config.group,
            "node_id": f"n{self.config.node_id}", "address": self.advertised,
            "role": role, "term": int(node.term) if node is not None else 0,
            "topics": {t: c.to_wire() for t, c in self.state.topics.items()},
            **({"membership": self._membership_registration(node)} if node is not None
               else {}),
        }

    @staticmethod
    def _membership_registration(node: RaftRuntime) -> dict[str, Any]:
        """The configuration as the NameServer's routes carry it."""
        m = node.membership
        return {"index": node.status().membership_index, "voters": sorted(m.voter_ids),
                "learners": sorted(m.learner_ids)}

    def status(self) -> dict[str, Any]:
        node = self.node
        info: dict[str, Any] = {}
        with contextlib.suppress(Exception):  # a stopping node: the broker's own figures
            info.update(node.status().to_json())
        info.update({
            "group": self.config.group, "node_id": self.config.node_id,
            "address": self.advertised, "role": node.role, "term": node.term,
            "leader_id": node.leader_id, "leader_address": self.leader_client_address(),
            "leader_ready": bool(node.leader_ready), "last_index": node.last_index,
            "commit_index": node.commit_index, "applied_index": self.state.applied_index,
            "dispatched_index": self._cq.dispatched_index if self._cq else 0,
            "topics": len(self.state.topics), "flush": self.config.flush,
            "replicate": self.config.replicate,
            "send_batches": self.sends.batches if self.sends else 0,
            "send_requests": self.sends.items if self.sends else 0,
            "admin_url": self.admin.url if self.admin is not None else None,
            "recovery": self.recovery, "snapshots": self._snapshot_status(),
            "queue_repairs": {"repaired": self.queue_repairs.repaired,
                              "failed": self.queue_repairs.failed},
            "identity": ({**self.identity.identity.to_json(), "how": self.identity.how}
                         if self.identity else None),
        })
        return {k: v for k, v in info.items() if isinstance(
            v, (str, int, float, bool, type(None), list, dict))}

    def _snapshot_status(self) -> dict[str, Any]:
        schedule = self._snapshots
        if schedule is None:
            return {}
        latest = schedule.latest
        return {**schedule.figures.to_json(),
                "latest_index": latest.index if latest else 0,
                "latest_end_position": latest.end_position if latest else 0,
                "latest_created_ms": latest.created_ms if latest else 0}
