"""Prometheus metrics of one broker node (prometheus-client, served at /metrics).

Two kinds of figures:

- **Read at scrape time** by `BrokerCollector` from what the node already
  keeps: Raft role, term and indexes, per-follower match index and lag, the
  runtime's counters (elections, leadership changes, proposals, ...), the
  Flusher's fsync counts, group-commit totals, ConsumeQueue offsets,
  consumer-group lag per queue, long-poll waiters, client connections. Nothing
  is added to the hot paths for these.
- **Observed where the runtime already does one step per batch**: the
  `Instruments` are the broker's `BrokerObserver`, which the runtime
  (`dledger.runtime.node.NodeObserver`), its Flusher
  (`commitlog.flush.FlushObserver`) and the broker's send path call: one
  observation per Ready (CommitLog append), per fsync round (latency and
  entries covered), per proposal (propose-to-ack latency: one per
  group-commit batch, not per message) and per group-commit batch
  (messages). The client listener (`ledgermq.wire.RpcServer`) reports
  every request to `Instruments.handled` (its `RequestObserver`): per request
  a count, errors by code and the duration
  (`ledgermq.webadmin.request_metrics`); pulls also count messages and body
  bytes out per topic. The hooks are typed, so renaming one breaks the type check
  instead of silently dropping a metric.

Messages and bytes *in* per topic are counted at scrape time from the
ConsumeQueue units dispatched since the previous scrape, so they are the same
on every replica and independent of the send request's format.

Every broker has its own CollectorRegistry (tests run several in a process).
Names follow the Prometheus conventions: `ledgermq_` prefix, base units in the
name (`_seconds`, `_bytes`), `_total` for counters. docs/operations.md lists
them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dledger.runtime.node import NodeCounters, NodeStatus
from ledgermq.base.codes import RequestCode
from ledgermq.broker.view import BrokerView
from ledgermq.webadmin.request_metrics import AuthFailures, RequestMetrics

ROLES = ("leader", "candidate", "pre_candidate", "follower")
# Latencies from ~100 µs (page-cache append) to seconds (a stalled disk).
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Most ConsumeQueue units one scrape reads to count messages and bytes in.
IN_SCAN_MAX = 200_000
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)



def _node_counters(c: NodeCounters) -> list[tuple[str, str, int]]:
    """The runtime's counters exported as counters: (name, help, value)."""
    return [
        ("ledgermq_raft_elections_total",
         "Elections this node started (became candidate in a new term).", c.elections),
        ("ledgermq_raft_leader_changes_total", "Times this node saw a new (leader, term).",
         c.leader_changes),
        ("ledgermq_raft_proposals_total", "Entries proposed on this node.", c.proposals),
        ("ledgermq_raft_proposals_acked_total",
         "Proposals acknowledged (committed/applied or stable).", c.proposals_acked),
        ("ledgermq_raft_proposals_unknown_total",
         "Proposals whose outcome could not be known (timeout, lost lead).",
         c.proposals_unknown),
        ("ledgermq_raft_readies_total", "Ready batches handled by the driver.", c.readies),
        ("ledgermq_raft_entries_written_total",
         "Entries written to the CommitLog by the driver.", c.entries_written),
        ("ledgermq_raft_append_acks_sent_total", "Append acknowledgements sent.", c.acks_sent),
        ("ledgermq_raft_peer_errors_total", "Messages that could not be sent.", c.peer_errors),
        ("ledgermq_raft_hard_state_saves_total", "Hard-state files written.",
         c.hard_state_saves),
        ("ledgermq_raft_applied_before_fsync_total",
         "Entries this leader applied while its own fsync of them ran (flush=sync): "
         "durable on a quorum of the others.", c.applied_before_fsync),
    ]


class BrokerCollector(Collector):
    """Figures read from the running broker at every scrape."""

    def __init__(self, broker: BrokerView) -> None:
        self.b = broker
        # Messages in: counted from the ConsumeQueues at scrape time (every
        # committed message gets a unit there, on every replica, whatever
        # request format brought it in). Per queue, the offset counted up to;
        # queues existing at start-up count from their end (counters start
        # with the process, as Prometheus expects).
        self._counted: dict[tuple[str, int], int] = {}
        self._in_messages: dict[str, int] = {}
        self._in_bytes: dict[str, int] = {}
        for key, queue in broker.cq.queues.items():
            self._counted[key] = queue.max_offset

    def _count_in(self) -> None:
        """Add the units dispatched since the last scrape (at most IN_SCAN_MAX per
        scrape, so a huge backlog is spread over several scrapes)."""
        cq = self.b.cq
        budget = IN_SCAN_MAX
        for (topic, queue_id), queue in list(cq.queues.items()):
            done = max(self._counted.get((topic, queue_id), 0), queue.min_offset)
            while done < queue.max_offset and budget > 0:
                units = queue.read(done, min(budget, 4096, queue.max_offset - done))
                if not units:
                    break
                self._in_messages[topic] = self._in_messages.get(topic, 0) + len(units)
                self._in_bytes[topic] = self._in_bytes.get(topic, 0) + sum(
                    u.size for u in units)
                done = units[-1].queue_offset + 1
                budget -= len(units)
            self._counted[(topic, queue_id)] = done

    def collect(self) -> Iterator[Any]:
        b = self.b
        node = b.node
        labels = ["group", "node"]
        ids = [b.config.group, str(b.config.node_id)]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(ids, value)
            return g

        role = GaugeMetricFamily("ledgermq_raft_role",
                                 "1 for this node's current Raft role, 0 for the others.",
                                 labels=[*labels, "role"])
        current = node.role
        for name in ROLES:
            role.add_metric([*ids, name], 1.0 if current == name else 0.0)
        yield role
        yield gauge("ledgermq_raft_leader_ready",
                    "1 when this node leads and its current-term no-op is applied.",
                    1.0 if node.leader_ready else 0.0)
        yield gauge("ledgermq_node_failed",
                    "1 when this replica stopped on a storage error or lost committed data"
                    " (the status page's `failed` says why); restart or repair it.",
                    1.0 if node.failed is not None else 0.0)
        yield gauge("ledgermq_raft_term", "Current Raft term.", node.term)
        yield gauge("ledgermq_raft_leader_id", "Node id of the known leader (0: none).",
                    node.leader_id or 0)
        yield gauge("ledgermq_raft_last_index", "Last log index.", node.last_index)
        yield gauge("ledgermq_raft_commit_index", "Commit index.", node.commit_index)
        yield gauge("ledgermq_raft_applied_index", "Index applied to the broker state.",
                    b.state.applied_index)
        yield gauge("ledgermq_commitlog_durable_index", "Highest fsynced log index.",
                    node.log.durable_index)
        yield gauge("ledgermq_consumequeue_dispatched_index",
                    "Highest index dispatched to the ConsumeQueues.", b.cq.dispatched_index)
        status: NodeStatus | None = None
        try:
            status = node.status()
        except Exception:  # a node that is stopping: skip the per-peer figures
            status = None
        match = GaugeMetricFamily("ledgermq_raft_follower_match_index",
                                  "Leader's view: highest index known replicated on a follower.",
                                  labels=[*labels, "follower"])
        lag = GaugeMetricFamily("ledgermq_raft_follower_lag_entries",
                                "Leader's view: entries a follower is behind the leader's log.",
                                labels=[*labels, "follower"])
        reserve = GaugeMetricFamily(
            "ledgermq_raft_follower_reserve",
            "Leader's view: 1 when a follower is a reserve, sent new entries in batches "
            "([raft] reserve_batch_entries).", labels=[*labels, "follower"])
        if current == "leader" and status is not None and status.core is not None:
            for peer, f in sorted(status.core.followers.items()):
                if peer == b.config.node_id:
                    continue
                match.add_metric([*ids, str(peer)], f.match)
                lag.add_metric([*ids, str(peer)], f.lag)
                reserve.add_metric([*ids, str(peer)], 1.0 if f.reserve else 0.0)
        yield match
        yield lag
        yield reserve
        core = status.core if status is not None else None
        for name, doc, count in (
                ("ledgermq_raft_reserve_appends_total",
                 "Appends with entries this node sent to reserves while leading "
                 "(each carries a batch).", core.reserve_appends if core else 0),
                ("ledgermq_raft_reserve_changes_total",
                 "Times a leading node's set of reserves changed after its first choice "
                 "(a reserve whose acknowledgement moved the commit became quick).",
                 core.reserve_changes if core else 0)):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(ids, float(count))
            yield c
        for name, doc, count in _node_counters(node.counters):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(ids, float(count))
            yield c
        c = CounterMetricFamily(
            "ledgermq_raft_auth_failures_total",
            "Raft peer connections refused before their handshake completed (or peers "
            "this node dialled that failed theirs), by reason.", labels=[*labels, "reason"])
        for reason, count in sorted(node.counters.auth_failures.items()):
            c.add_metric([*ids, reason], float(count))
        yield c
        c = CounterMetricFamily("ledgermq_commitlog_fsyncs_total",
                                "fsync rounds run by the CommitLog flusher.", labels=labels)
        c.add_metric(ids, float(status.fsyncs if status else 0))
        yield c
        c = CounterMetricFamily("ledgermq_commitlog_fsynced_entries_total",
                                "Entries made durable by fsync rounds.", labels=labels)
        c.add_metric(ids, float(status.fsynced_entries if status else 0))
        yield c
        c = CounterMetricFamily(
            "ledgermq_commitlog_fsyncs_in_place_total",
            "fsync rounds run on the event loop's thread instead of the fsync thread "
            "(flush=sync: a follower's, or a leader's small entries).", labels=labels)
        c.add_metric(ids, float(status.fsyncs_in_place if status else 0))
        yield c
        c = CounterMetricFamily(
            "ledgermq_commitlog_fsync_handoff_seconds_total",
            "Time fsync rounds spent passing between the event loop and the fsync "
            "thread (both ways), beyond the fsync itself.", labels=labels)
        c.add_metric(ids, float(status.fsync_handoff_seconds if status else 0.0))
        yield c
        yield gauge("ledgermq_raft_pending_proposals", "Proposals waiting for their ack.",
                    status.pending_proposals if status else 0)
        for committer, what in ((b.sends, "send"), (b.controls, "control")):
            if committer is None:
                continue
            c = CounterMetricFamily(f"ledgermq_group_commit_{what}_batches_total",
                                    f"Group-commit {what} batches proposed (one entry each).",
                                    labels=labels)
            c.add_metric(ids, float(committer.batches))
            yield c
            c = CounterMetricFamily(f"ledgermq_group_commit_{what}_requests_total",
                                    f"Requests carried by group-commit {what} batches.",
                                    labels=labels)
            c.add_metric(ids, float(committer.items))
            yield c
        yield from self._queues(labels, ids)
        yield from self._retention(labels, ids)
        yield gauge("ledgermq_longpoll_waiting_queues",
                    "Queues with at least one long-polling pull waiting.", b.longpoll.waiting)
        yield gauge("ledgermq_client_connections", "Open client connections.",
                    b.rpc.connection_count if b.rpc is not None else 0)
        poller = b.rpc.poller if b.rpc is not None else None
        for name, doc, count in (
                ("ledgermq_busy_poll_spins_total",
                 "Busy-poll spins of this node's event loop (busy_poll_us): started after it "
                 "sent entries or answered a client.",
                 poller.spins if poller else 0),
                ("ledgermq_busy_poll_ended_by_input_total",
                 "Busy-poll spins a readable connection ended before their window ran out.",
                 poller.ended_by_input if poller else 0)):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(ids, float(count))
            yield c
        limits = CounterMetricFamily(
            "ledgermq_client_limit_events_total",
            "Client connections refused or closed by a resource bound"
            " (docs/security.md, Bounded resources), by reason.", labels=[*labels, "reason"])
        for reason, count in sorted((b.rpc.limit_events if b.rpc is not None else {}).items()):
            limits.add_metric([*ids, reason], float(count))
        yield limits
        yield gauge("ledgermq_topics", "Topics configured.", len(b.state.topics))
        c = CounterMetricFamily("ledgermq_bad_control_entries_total",
                                "CONTROL entries skipped because they were not msgpack.",
                                labels=labels)
        c.add_metric(ids, float(b.state.bad_control_entries))
        yield c

    def _retention(self, labels: list[str], ids: list[str]) -> Iterator[Any]:
        """Disk usage, the watermarks' refusals and what retention deleted."""
        retention = self.b.retention
        if retention is None:
            return
        log_ = self.b.node.log
        c = retention.counters

        def one(family: GaugeMetricFamily | CounterMetricFamily, value: float
                ) -> GaugeMetricFamily | CounterMetricFamily:
            family.add_metric(ids, value)
            return family

        if retention.disk is not None:
            yield one(GaugeMetricFamily(
                "ledgermq_disk_usage_ratio", "Used fraction of the data directory's file"
                " system (df's Use%); above disk_hard_ratio new messages are refused.",
                labels=labels), retention.disk.ratio)
            yield one(GaugeMetricFamily(
                "ledgermq_disk_free_bytes", "Bytes available on the data directory's file"
                " system.", labels=labels), retention.disk.free_bytes)
        yield one(GaugeMetricFamily(
            "ledgermq_disk_refusing_writes", "1 while the disk is above disk_hard_ratio and"
            " SEND_MESSAGES is answered DISK_FULL.", labels=labels),
            1.0 if retention.refusing else 0.0)
        refused = CounterMetricFamily(
            "ledgermq_writes_refused_total", "Send requests refused to protect the disk,"
            " by reason (disk_full: above disk_hard_ratio).", labels=[*labels, "reason"])
        for reason in sorted({"disk_full", *c.writes_refused}):
            refused.add_metric([*ids, reason], float(c.writes_refused.get(reason, 0)))
        yield refused
        yield one(GaugeMetricFamily("ledgermq_commitlog_first_index",
                                    "First index this replica's CommitLog still holds.",
                                    labels=labels), log_.first_index)
        log_bytes = retention.log_bytes()
        if log_bytes is not None:
            yield one(GaugeMetricFamily("ledgermq_commitlog_bytes",
                                        "Bytes of CommitLog segments and index files.",
                                        labels=labels), log_bytes)
        yield one(GaugeMetricFamily("ledgermq_retention_trim_position",
                                    "The group's agreed trim point (a CommitLog position).",
                                    labels=labels), self.b.state.trim)
        for name, doc, value in (
                ("segments_deleted", "CommitLog segments deleted by retention.",
                 c.segments_deleted),
                ("bytes_deleted", "CommitLog segment bytes deleted by retention.",
                 c.bytes_deleted),
                ("trims_proposed", "log.trim operations this node proposed as leader.",
                 c.trims_proposed),
                ("failures", "Retention passes or deletions that failed.", c.failures)):
            yield one(CounterMetricFamily(f"ledgermq_retention_{name}_total", doc,
                                          labels=labels), float(value))

    def _queues(self, labels: list[str], ids: list[str]) -> Iterator[Any]:
        b = self.b
        cq = b.cq
        stored = CounterMetricFamily(
            "ledgermq_topic_messages_stored_total",
            "Messages committed to a topic (sum of its queues' max offsets).",
            labels=[*labels, "topic"])
        queue_max = GaugeMetricFamily("ledgermq_queue_max_offset",
                                      "Next queue offset (messages committed to the queue).",
                                      labels=[*labels, "topic", "queue"])
        per_topic: dict[str, int] = {}
        for (topic, queue_id), queue in sorted(cq.queues.items()):
            if topic not in b.state.topics:
                continue
            per_topic[topic] = per_topic.get(topic, 0) + queue.max_offset
            queue_max.add_metric([*ids, topic, str(queue_id)], queue.max_offset)
        for topic, total in sorted(per_topic.items()):
            stored.add_metric([*ids, topic], float(total))
        yield stored
        yield queue_max
        repairs = CounterMetricFamily(
            "ledgermq_consumequeue_repairs_total",
            "ConsumeQueues a read found damaged and rebuilt from the CommitLog, by outcome.",
            labels=[*labels, "outcome"])
        repairs.add_metric([*ids, "repaired"], float(b.queue_repairs.repaired))
        repairs.add_metric([*ids, "failed"], float(b.queue_repairs.failed))
        yield repairs
        self._count_in()
        msgs = CounterMetricFamily("ledgermq_messages_in_total",
                                   "Messages committed to a topic since this process started.",
                                   labels=[*labels, "topic"])
        size = CounterMetricFamily("ledgermq_bytes_in_total",
                                   "Record bytes of the messages committed to a topic since"
                                   " this process started.", labels=[*labels, "topic"])
        for topic in sorted(self._in_messages):
            msgs.add_metric([*ids, topic], float(self._in_messages[topic]))
            size.add_metric([*ids, topic], float(self._in_bytes[topic]))
        yield msgs
        yield size
        lag = GaugeMetricFamily("ledgermq_consumer_group_lag_messages",
                                "Messages of a queue not yet consumed by a group"
                                " (queue max offset - committed offset).",
                                labels=[*labels, "consumer_group", "topic", "queue"])
        offset = GaugeMetricFamily("ledgermq_consumer_group_offset",
                                   "Committed consumer offset.",
                                   labels=[*labels, "consumer_group", "topic", "queue"])
        for (group, topic, queue_id), committed in sorted(b.state.offsets.items()):
            hi = cq.offsets(topic, queue_id)[1]
            key = [*ids, group, topic, str(queue_id)]
            offset.add_metric(key, committed)
            lag.add_metric(key, max(0, hi - committed))
        yield lag
        yield offset


class Instruments:
    """Histograms and counters fed by explicit calls: the broker's
    `BrokerObserver` (runtime, Flusher, send path) and its wrapped handlers.

    Made before the broker starts (the runtime reports from its first Ready);
    `register` puts them into the admin app's registry.
    """

    def __init__(self, group: str, node_id: int) -> None:
        ids = {"group": group, "node": str(node_id)}
        self._ids = ids
        labels = list(ids)
        # Unregistered until `register`: the scrape-time collector comes first.
        self._append_seconds = Histogram(
            "ledgermq_commitlog_append_seconds",
            "Time to write one Ready's entries to the CommitLog (page cache).",
            labels, registry=None, buckets=LATENCY_BUCKETS)
        self._append_entries = Histogram(
            "ledgermq_commitlog_append_entries", "Entries per CommitLog append (per Ready).",
            labels, registry=None, buckets=SIZE_BUCKETS)
        self._fsync_seconds = Histogram(
            "ledgermq_commitlog_fsync_seconds", "Duration of one fsync round.",
            labels, registry=None, buckets=LATENCY_BUCKETS)
        self._fsync_entries = Histogram(
            "ledgermq_commitlog_fsync_batch_entries", "Entries made durable by one fsync round.",
            labels, registry=None, buckets=SIZE_BUCKETS)
        self._commit_seconds = Histogram(
            "ledgermq_raft_commit_seconds",
            "Propose-to-acknowledgement time of one entry on the leader (commit and apply"
            " with replicate=sync).", labels, registry=None, buckets=LATENCY_BUCKETS)
        self._group_commit_messages = Histogram(
            "ledgermq_group_commit_batch_messages", "Messages per group-commit send batch.",
            labels, registry=None, buckets=SIZE_BUCKETS)
        self.requests = RequestMetrics("ledgermq_", "Client request", ids, LATENCY_BUCKETS)
        self.messages_out = Counter("ledgermq_messages_out_total",
                                    "Messages returned by pulls from this node.",
                                    [*labels, "topic"], registry=None)
        self.bytes_out = Counter("ledgermq_bytes_out_total",
                                 "Message body bytes returned by pulls from this node.",
                                 [*labels, "topic"], registry=None)
        self._metrics = [self._append_seconds, self._append_entries, self._fsync_seconds,
                         self._fsync_entries, self._commit_seconds,
                         self._group_commit_messages, *self.requests.metrics,
                         self.messages_out, self.bytes_out]
        self.append_seconds = self._append_seconds.labels(**ids)
        self.append_entries = self._append_entries.labels(**ids)
        self.fsync_seconds = self._fsync_seconds.labels(**ids)
        self.fsync_entries = self._fsync_entries.labels(**ids)
        self.commit_seconds = self._commit_seconds.labels(**ids)
        self.group_commit_messages = self._group_commit_messages.labels(**ids)

    def register(self, registry: CollectorRegistry) -> None:
        for metric in self._metrics:
            registry.register(metric)

    # ------------------------------------------------- BrokerObserver

    def appended(self, seconds: float, entries: int) -> None:
        self.append_seconds.observe(seconds)
        self.append_entries.observe(entries)

    def synced(self, seconds: float, entries: int) -> None:
        self.fsync_seconds.observe(seconds)
        self.fsync_entries.observe(entries)

    def acked(self, seconds: float) -> None:
        self.commit_seconds.observe(seconds)

    def send_batch(self, messages: int) -> None:
        self.group_commit_messages.observe(messages)

    # ------------------------------------------------- RequestObserver

    def handled(self, code: int, seconds: float, error: Exception | None,
                result: Any) -> None:
        """Every request the client listener's handlers ran (its RpcServer's
        observer): counts, errors and time, and what pulls returned."""
        self.requests.handled(code, seconds, error, result)
        if code == RequestCode.PULL_MESSAGES and result is not None:
            self._count_pulled(result)

    def _count_pulled(self, result: Any) -> None:
        messages = result.get("messages") or ()
        if not messages:
            return
        topic = messages[0]["topic"]  # one pull reads one queue of one topic
        self.messages_out.labels(**self._ids, topic=topic).inc(len(messages))
        self.bytes_out.labels(**self._ids, topic=topic).inc(
            sum(len(m["body"]) for m in messages))


def broker_registry(broker: BrokerView, instruments: Instruments) -> CollectorRegistry:
    """A registry with the scrape-time collector and the broker's instruments."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))
    instruments.register(registry)
    auth = AuthFailures({"group": broker.config.group, "node": str(broker.config.node_id)})
    if broker.rpc is not None:
        auth.add("client", broker.rpc.auth_failures)
    registry.register(auth)
    return registry
