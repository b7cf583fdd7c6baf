"""The rule every listening port follows: without authentication, listen on
loopback only, unless explicitly told to run open — then warn loudly.

The broker (client port, Raft port, admin app), the NameServer (client port,
admin app) and the admin apps apply this one function at start, before
anything is bound; docs/security.md explains the rule.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ledgermq.base.address import is_loopback_host

log = logging.getLogger(__name__)


class ExposureError(ValueError):
    """A server would listen off loopback without authentication."""


def check_exposure(listening: Mapping[str, str], *, authenticated: bool, allow_open: bool,
                   remedy: str) -> None:
    """`listening` maps what listens ("client port", "admin app") to its host.
    Raise ExposureError (with `remedy`, how to turn authentication on or run
    open on purpose) when an unauthenticated one is off loopback and
    `allow_open` is not set; with it, log a loud warning instead."""
    if authenticated:
        return
    exposed = {what: host for what, host in listening.items() if not is_loopback_host(host)}
    if not exposed:
        log.warning("running without authentication (%s on loopback only)",
                    ", ".join(listening))
        return
    where = ", ".join(f"{what} on {host or '*'}" for what, host in exposed.items())
    if not allow_open:
        raise ExposureError(f"refusing to start without authentication while listening off "
                            f"loopback ({where}): {remedy}")
    log.warning("!!! RUNNING OPEN: no authentication while listening off loopback (%s); "
                "anyone who can reach these ports can read, write and delete data, register "
                "brokers and forge Raft messages (allow_open) !!!", where)
