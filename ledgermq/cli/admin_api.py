"""What the admin-API commands (status, topic, group, message, leader) share:
their `--admin`, `--token` and `--namesrv` options and the call itself."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote as _quote

import typer

from ledgermq.webadmin.app import DEFAULT_ADMIN_URL

ADMIN_OPTION = typer.Option(DEFAULT_ADMIN_URL, "--admin", envvar="LEDGERMQ_ADMIN_URL",
                            help="Admin API base URL (a NameServer's or a broker's).")
TOKEN_OPTION = typer.Option("", "--token", envvar="LEDGERMQ_ADMIN_TOKEN",
                            help="Admin token (needed for writes when one is configured).")
# Clusters started without admin apps are still reachable over the wire
# protocol through their NameServers.
NAMESRV_OPTION = typer.Option(
    "", "--namesrv", help="Ask these NameServers over the wire protocol instead of the admin"
    " API (for clusters without an admin app); comma separated.")


def call(admin: str, method: str, path: str, body: Any = None, token: str = "",
         query: dict[str, str | int] | None = None) -> Any:
    """One admin API call (`path` under /api/v1); its JSON answer. An error
    answer raises AdminApiError, which the CLI prints as one line."""
    from urllib.parse import urlencode

    from ledgermq.base import loop
    from ledgermq.webadmin.app import api_call

    if query:
        path = f"{path}?{urlencode(query)}"
    return loop.run(api_call(admin, method, path, body, token))


def quote(name: str) -> str:
    """A name as one path segment of a URL."""
    return _quote(name, safe="")
