"""Request metrics of one server: how many requests of each kind it handled,
how many it answered with an error (by error code) and how long they took.

`RequestMetrics` is the `ledgermq.wire.RequestObserver` the broker and the
NameServer give their `RpcServer`, which reports every request a handler ran;
nothing wraps or replaces the handlers. `AuthFailures` reads the refused
authentications the servers count (`RpcServer.auth_failures`) at scrape time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import ErrorCode, LedgerMQError

_REQUEST_NAMES = {int(code): code.name.lower() for code in RequestCode}


def error_code_name(error: Exception) -> str:
    """The `code` label of an error: its ErrorCode's name, INTERNAL for any
    exception that is not a LedgerMQError."""
    if not isinstance(error, LedgerMQError):
        return "INTERNAL"
    try:
        return ErrorCode(error.code).name
    except ValueError:
        return str(error.code)


class RequestMetrics:
    """`{prefix}requests_total`, `{prefix}request_errors_total` and
    `{prefix}request_seconds`, labelled by `ids` (fixed per server) and the
    request's name. `subject` starts the help texts ("Client request")."""

    def __init__(self, prefix: str, subject: str, ids: Mapping[str, str],
                 buckets: Sequence[float], registry: CollectorRegistry | None = None) -> None:
        self._ids = dict(ids)
        labels = list(ids)
        self.requests = Counter(f"{prefix}requests_total", f"{subject}s handled.",
                                [*labels, "request"], registry=registry)
        self.errors = Counter(f"{prefix}request_errors_total",
                              f"{subject}s answered with an error, by error code.",
                              [*labels, "request", "code"], registry=registry)
        self.seconds = Histogram(f"{prefix}request_seconds", f"{subject} handling time.",
                                 [*labels, "request"], registry=registry, buckets=buckets)
        self._children: dict[int, tuple[Any, Any, str]] = {}

    @property
    def metrics(self) -> list[Counter | Histogram]:
        return [self.requests, self.errors, self.seconds]

    def handled(self, code: int, seconds: float, error: Exception | None,
                result: Any) -> None:
        children = self._children.get(code)
        if children is None:
            name = _REQUEST_NAMES.get(code, str(code))
            children = (self.requests.labels(**self._ids, request=name),
                        self.seconds.labels(**self._ids, request=name), name)
            self._children[code] = children
        count, duration, name = children
        count.inc()
        duration.observe(seconds)
        if error is not None:
            self.errors.labels(**self._ids, request=name, code=error_code_name(error)).inc()


class AuthFailures(Collector):
    """`ledgermq_auth_failures_total{..ids, port, reason}`: refused
    authentications, read at scrape time from each port's counter (a mapping
    reason -> count, such as `RpcServer.auth_failures`)."""

    def __init__(self, ids: Mapping[str, str] | None = None) -> None:
        self._ids = dict(ids or {})
        self._ports: dict[str, Mapping[str, int]] = {}

    def add(self, port: str, counts: Mapping[str, int]) -> None:
        self._ports[port] = counts

    def collect(self) -> Any:
        family = CounterMetricFamily(
            "ledgermq_auth_failures", "Refused authentications, by port and reason.",
            labels=[*self._ids, "port", "reason"])
        for port, counts in sorted(self._ports.items()):
            for reason, count in sorted(counts.items()):
                family.add_metric([*self._ids.values(), port, reason], count)
        yield family
