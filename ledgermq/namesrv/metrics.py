"""Prometheus metrics of a NameServer (prometheus-client, served at /metrics).

The registry's contents are read at scrape time (`NameServerCollector`: groups,
nodes by registered role, each group's leader term, topics, connections); the
request handlers are wrapped once at start-up to count requests, errors by
code and handling time, so namesrv/server.py carries no metrics code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ledgermq.base.clock import monotonic_ms
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import ErrorCode, LedgerMQError
from ledgermq.namesrv.view import NameServerView

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
    """A registry for one NameServer; wraps its handlers to count requests."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NameServerCollector(server))
    requests = Counter("ledgermq_namesrv_requests_total", "Requests handled.", ["request"],
                       registry=registry)
    errors = Counter("ledgermq_namesrv_request_errors_total",
                     "Requests answered with an error, by error code.", ["request", "code"],
                     registry=registry)
    seconds = Histogram("ledgermq_namesrv_request_seconds", "Request handling time.",
                        ["request"], registry=registry, buckets=_BUCKETS)
    names = {int(c): c.name.lower() for c in RequestCode}

    def wrap(name: str, handler: Callable[..., Any]) -> Callable[..., Any]:
        count = requests.labels(request=name)
        duration = seconds.labels(request=name)

        async def wrapped(body: Any, conn: Any) -> Any:
            count.inc()
            started = time.perf_counter()
            try:
                return await handler(body, conn)
            except LedgerMQError as exc:
                try:
                    code = ErrorCode(exc.code).name
                except ValueError:
                    code = str(exc.code)
                errors.labels(request=name, code=code).inc()
                raise
            except Exception:
                errors.labels(request=name, code="INTERNAL").inc()
                raise
            finally:
                duration.observe(time.perf_counter() - started)

        return wrapped

    handlers = server.rpc.handlers
    for code, handler in list(handlers.items()):
        handlers[code] = wrap(names.get(int(code), str(code)), handler)
    return registry
