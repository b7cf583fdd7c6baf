"""Prometheus metrics of a NameServer (prometheus-client, served at /metrics).

The registry's contents are read at scrape time (`NameServerCollector`: groups,
nodes by registered role, each group's leader term, topics, connections); the
NameServer's RpcServer reports every request to a `RequestMetrics` (counts,
errors by code, handling time), so namesrv/server.py carries no metrics code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ledgermq.base.clock import monotonic_ms
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


def namesrv_registry(server: NameServerView) -> CollectorRegistry:
    """A registry for one NameServer; its RpcServer reports every request to it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NameServerCollector(server))
    auth = AuthFailures()
    auth.add("client", server.rpc.auth_failures)
    registry.register(auth)
    server.rpc.observer = RequestMetrics("ledgermq_namesrv_", "Request", {}, _BUCKETS,
                                         registry=registry)
    return registry
