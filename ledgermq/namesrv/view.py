"""What the NameServer's admin app and metrics read of a running NameServer.

A read-only `Protocol` that `namesrv.server.NameServer` satisfies, so
`admin_http` and `metrics` depend on this small view instead of on the
server module (which starts them: importing it back would be a cycle).
"""

from __future__ import annotations

from typing import Protocol

from ledgermq.namesrv.registry import RouteRegistry
from ledgermq.wire import RpcServer


class NameServerView(Protocol):
    @property
    def registry(self) -> RouteRegistry:
        """The route table (sans-I/O: callers pass the time)."""

    @property
    def rpc(self) -> RpcServer:
        """The client listener (its handlers and connection count)."""
