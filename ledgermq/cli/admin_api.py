"""What the admin-API commands (status, topic, group, message, leader) share:
their `--admin`, credentials (`--access-key/--secret-file`, or the pre-signing
`--token`), `--tls-ca-file` and `--namesrv` options and the call itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote as _quote

import typer

from ledgermq.webadmin.app import DEFAULT_ADMIN_URL

ADMIN_OPTION = typer.Option(DEFAULT_ADMIN_URL, "--admin", envvar="LEDGERMQ_ADMIN_URL",
                            help="Admin API base URL (a NameServer's or a broker's).")
TOKEN_OPTION = typer.Option("", "--token", envvar="LEDGERMQ_ADMIN_TOKEN",
                            help="Admin token of a server without authentication (needed for"
                            " writes when one is configured there).")
ACCESS_KEY_OPTION = typer.Option("", "--access-key", envvar="LEDGERMQ_ACCESS_KEY",
                                 help="Access key to sign admin API requests with.")
SECRET_FILE_OPTION = typer.Option("", "--secret-file", envvar="LEDGERMQ_SECRET_FILE",
                                  help="File (mode 0600) holding that access key's secret.")
TLS_CA_OPTION = typer.Option("", "--tls-ca-file", envvar="LEDGERMQ_TLS_CA_FILE",
                             help="CA certificate (PEM) that verifies an https admin API.")
# Clusters started without admin apps are still reachable over the wire
# protocol through their NameServers.
NAMESRV_OPTION = typer.Option(
    "", "--namesrv", help="Ask these NameServers over the wire protocol instead of the admin"
    " API (for clusters without an admin app); comma separated.")


@dataclass(frozen=True)
class Target:
    """Which admin API a command talks to, and as whom."""

    url: str = DEFAULT_ADMIN_URL
    access_key: str = ""
    secret_file: str = ""
    token: str = ""
    tls_ca_file: str = ""


def target(admin: str, access_key: str = "", secret_file: str = "", token: str = "",
           tls_ca_file: str = "") -> Target:
    return Target(admin, access_key, secret_file, token, tls_ca_file)


def call(to: Target, method: str, path: str, body: Any = None,
         query: dict[str, str | int] | None = None, timeout: float = 20.0) -> Any:
    """One admin API call (`path` under /api/v1); its JSON answer. An error
    answer raises AdminApiError, which the CLI prints as one line; so does a
    bad credential file."""
    from ledgermq.base import loop
    from ledgermq.client.admin import AdminApi, load_credentials
    from ledgermq.webadmin.app import AdminApiError

    try:
        credentials = load_credentials(to.access_key, to.secret_file)
    except ValueError as exc:  # SecretFileError included
        raise AdminApiError(0, "BAD_CREDENTIALS", str(exc)) from None

    async def main() -> Any:
        async with AdminApi(to.url, credentials=credentials, token=to.token,
                            ca_file=to.tls_ca_file, timeout=timeout) as api:
            return await api.call(method, path, body, query)

    return loop.run(main())


def quote(name: str) -> str:
    """A name as one path segment of a URL."""
    return _quote(name, safe="")
