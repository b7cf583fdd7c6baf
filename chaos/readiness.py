"""Whether a started node is really up: its process alive and answering PING.

A line in a log proves nothing. A broker that dies at start prints a rich
traceback, which shows the source lines around each frame, `print(f"broker
listening on ...")` among them, and a harness that waits for that text calls
the dead node restarted. So a node is ready only when its process is alive
and a PING over the wire protocol comes back with the token sent (the
broker binds its client port only after recovery and the Raft node have
started). When it is not, the answer says why, with the exit status and the
last lines of its log: a node that did not come back is a finding of the
run, not a footnote.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.security import OPEN, ClientSecurity
from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import LedgerMQError
from ledgermq.wire.rpc_client import RpcClient

TAIL_LINES = 20


@dataclass(frozen=True)
class Readiness:
    """The outcome of waiting for one node (or the NameServer) to come up."""

    name: str
    ready: bool
    reason: str
    exit_status: int | None = None  # set when the process exited
    log_tail: tuple[str, ...] = ()
    waited_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ready": self.ready, "reason": self.reason,
                "exit_status": self.exit_status, "log_tail": list(self.log_tail),
                "waited_s": round(self.waited_s, 3)}


def ping(address: str, timeout: float = 2.0,
         enter: Callable[[], None] | None = None,
         security: ClientSecurity = OPEN) -> str | None:
    """None if the server at HOST:PORT echoes a PING, else why not.

    In a secured run (`security`) the PING goes over TLS after a successful
    AUTH as the bootstrap admin: a node that cannot check credentials is not up.

    Runs in a thread of its own: `enter` is called there first (the netns
    backend enters its namespace, which is per thread), and the PING gets an
    event loop of its own whatever the calling thread is running.
    """
    host, port = split_host_port(address)
    outcome: list[str | None] = []

    async def once() -> None:
        async with await RpcClient.connect(host, port, role="admin", name="chaos-ready",
                                           timeout=timeout, **security.as_admin()) as client:
            token = f"ready-{time.monotonic_ns()}"
            echoed = await client.request(RequestCode.PING, token)
            if echoed != token:
                raise LedgerMQError(f"PING echoed {echoed!r}, sent {token!r}")

    def run() -> None:
        try:
            if enter is not None:
                enter()
            asyncio.run(once())
        except (OSError, LedgerMQError, TimeoutError) as exc:
            outcome.append(f"{type(exc).__name__}: {exc}")
        except BaseException as exc:  # reported, never taken for an answer
            outcome.append(f"PING failed: {exc!r}")
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, name="chaos-ping", daemon=True)
    thread.start()
    thread.join(timeout + 5.0)
    return outcome[0] if outcome else f"PING did not finish within {timeout + 5.0:g} s"


def log_tail(path: Path, start: int = 0, lines: int = TAIL_LINES) -> tuple[str, ...]:
    """The last `lines` lines written to `path` from byte `start` on."""
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            text = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ()
    return tuple(text.splitlines()[-lines:])


def wait_ready(name: str, *, exit_status: Callable[[], int | None],
               answers: Callable[[], str | None], tail: Callable[[], tuple[str, ...]],
               timeout: float, interval: float = 0.2) -> Readiness:
    """Poll until the process answers (ready), exits, or `timeout` passes.

    `exit_status` is None while the process runs; `answers` is None when it
    answered a PING, else why not; `tail` gives the log's last lines.
    """
    started = time.monotonic()
    deadline = started + timeout
    last = "not asked yet"
    while True:
        status = exit_status()
        if status is not None:
            return Readiness(name, False, f"exited with status {status} before answering PING",
                             status, tail(), time.monotonic() - started)
        why = answers()
        if why is None:
            # It answered; make sure it did not die right after.
            status = exit_status()
            if status is None:
                return Readiness(name, True, "alive and answering PING",
                                 waited_s=time.monotonic() - started)
            continue
        last = why
        if time.monotonic() >= deadline:
            return Readiness(name, False, f"alive but no PING answer within {timeout:g} s "
                             f"(last: {last})", None, tail(), time.monotonic() - started)
        time.sleep(interval)
