"""Prometheus metrics of a NameServer (prometheus-client, served at /metrics).

The registry's contents are read at scrape time (`NameServerCollector`: groups,
nodes by registered role, each group's leader term, topics, connections); the
NameServer's RpcServer reports every request to a `RequestMetrics` (counts,
errors by code, handling time), so namesrv/server.py carries no metrics code.
With a reports directory, `AuditCollector` reads the nightly audit's latest
verdict at every scrape (namesrv/audit_verdict.py) and exports it under the
names the audit's own `audit.prom` uses (docs/audit.md, "Results an operator
sees").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ledgermq.base.clock import monotonic_ms
from ledgermq.namesrv.audit_verdict import DEFAULT_STALE_AFTER_S, NoAudit, read_verdict
from ledgermq.namesrv.view import NameServerView
from ledgermq.webadmin.request_metrics import AuthFailures, RequestMetrics

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class NameServerCollector(Collector):
    """Route-registry figures, read at every scrape."""

    def __init__(self, server: NameServerView) -> None:
        self.server = server

    def collect(self) -> Iterator[Any]:
        view = self.server.registry.cluster(monotonic_ms())
        groups = view.get("groups", {})
        nodes = GaugeMetricFamily("ledgermq_namesrv_brokers",
                                  "Registered broker nodes by group and registered role.",
                                  labels=["group", "role"])
        term = GaugeMetricFamily("ledgermq_namesrv_group_leader_term",
                                 "Term of the leader the NameServer routes a group to.",
                                 labels=["group"])
        has_leader = GaugeMetricFamily("ledgermq_namesrv_group_has_leader",
                                       "1 when the group has a registered leader.",
                                       labels=["group"])
        topics: set[str] = set()
        for name, info in sorted(groups.items()):
            counts = {"leader": 0, "follower": 0, "candidate": 0}
            for node in info.get("nodes", []):
                role = str(node.get("role", "follower"))
                counts[role] = counts.get(role, 0) + 1
                topics.update(node.get("topics", []))
            for role, count in sorted(counts.items()):
                nodes.add_metric([name, role], count)
            term.add_metric([name], info.get("leader_term") or 0)
            has_leader.add_metric([name], 1.0 if info.get("leader") else 0.0)
        yield nodes
        yield term
        yield has_leader
        g = GaugeMetricFamily("ledgermq_namesrv_groups", "Registered broker groups.")
        g.add_metric([], len(groups))
        yield g
        g = GaugeMetricFamily("ledgermq_namesrv_topics", "Topics registered by any broker.")
        g.add_metric([], len(topics))
        yield g
        g = GaugeMetricFamily("ledgermq_namesrv_connections", "Open connections.")
        g.add_metric([], self.server.rpc.connection_count)
        yield g


class AuditCollector(Collector):
    """The nightly audit's latest verdict, read from the reports directory at each
    scrape. Nothing is exported without a verdict (no reports directory, no
    latest.json); a refused latest.json exports `ledgermq_audit_latest_readable 0`
    and `ledgermq_audit_passed 0`."""

    def __init__(self, reports_dir: str, stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
        self.reports_dir = reports_dir
        self.stale_after_s = stale_after_s

    def collect(self) -> Iterator[Any]:
        try:
            verdict = read_verdict(self.reports_dir, self.stale_after_s)
        except NoAudit:
            return
        night = verdict.night

        def gauge(name: str, doc: str, value: float | None = None,
                  labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=list(labels))
            if value is not None:
                g.add_metric([], value)
            return g

        yield gauge("ledgermq_audit_last_success_timestamp_seconds",
                    "When the newest night that passed finished (seconds since the epoch;"
                    " 0: none).", verdict.last_success or 0.0)
        yield gauge("ledgermq_audit_latest_readable",
                    "1 when latest.json was read and believed, 0 when it was refused.",
                    1.0 if night else 0.0)
        yield gauge("ledgermq_audit_passed",
                    "1 when the latest night passed, else 0 (also when latest.json is "
                    "unreadable).", 1.0 if night and night["exit"] == 0 else 0.0)
        if night is None:
            return
        yield gauge("ledgermq_audit_last_run_timestamp_seconds",
                    "When the latest night finished (seconds since the epoch).",
                    night["finished"])
        yield gauge("ledgermq_audit_exit_code",
                    "Exit status of the latest night: 0 passed, 1 a check failed, 2 inputs "
                    "unreadable.", night["exit"])
        yield gauge("ledgermq_audit_entries_audited",
                    "Entries the latest night read, all groups and replicas.",
                    night["entries_audited"])
        yield gauge("ledgermq_audit_bytes_audited",
                    "Bytes the latest night read, all groups and replicas.",
                    night["bytes_audited"])
        yield gauge("ledgermq_audit_duration_seconds", "How long the latest night took.",
                    night["duration_s"])
        findings = gauge("ledgermq_audit_findings",
                         "Violations of each kind in the latest night, all groups.",
                         labels=("kind",))
        for kind, n in sorted(night["findings"].items()):
            findings.add_metric([kind], n)
        yield findings
        per_group = gauge("ledgermq_audit_group_findings",
                          "Violations of each kind in the latest night, per group.",
                          labels=("group", "kind"))
        through = gauge("ledgermq_audit_verified_through",
                        "The highest Raft index of the group verified so far.",
                        labels=("group",))
        oldest = gauge("ledgermq_audit_oldest_verification_timestamp_seconds",
                       "The oldest last-verified time of any range the group's manifest "
                       "keeps.", labels=("group",))
        for name, g in sorted(night["groups"].items()):
            for kind, n in sorted(g["findings"].items()):
                per_group.add_metric([name, kind], n)
            through.add_metric([name], g["verified_through"])
            if g["oldest_verification"] is not None:
                oldest.add_metric([name], g["oldest_verification"])
        yield per_group
        yield through
        yield oldest


def namesrv_registry(server: NameServerView, reports_dir: str = "",
                     audit_stale_after_s: float = DEFAULT_STALE_AFTER_S) -> CollectorRegistry:
    """A registry for one NameServer; its RpcServer reports every request to it.
    With `reports_dir`, the audit's latest verdict too."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NameServerCollector(server))
    if reports_dir:
        registry.register(AuditCollector(reports_dir, audit_stale_after_s))
    auth = AuthFailures()
    auth.add("client", server.rpc.auth_failures)
    registry.register(auth)
    server.rpc.observer = RequestMetrics("ledgermq_namesrv_", "Request", {}, _BUCKETS,
                                         registry=registry)
    return registry
