"""Run `ledgermq namesrv` as a real subprocess on an ephemeral port (test helper).

Shared by the NameServer tests and by broker and client tests that need a
NameServer to register with. Started and stopped through
`ledgermq.base.processes`.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ledgermq.base.processes import SOURCE_ROOT, Child, spawn

REPO = SOURCE_ROOT
LISTENING = re.compile(r"namesrv listening on (\S+):(\d+)")


@dataclass
class NameServerProcess:
    child: Child
    host: str
    port: int

    @property
    def proc(self) -> subprocess.Popen[str]:
        return self.child.proc

    @property
    def output(self) -> list[str]:
        return self.child.output

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signal the process by PID and wait for it; kill it if it will not stop."""
        return self.child.stop(sig, timeout)


def ledgermq_command() -> list[str]:
    """How to run the `ledgermq` console script of this virtualenv."""
    script = Path(sys.executable).parent / "ledgermq"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ledgermq.cli"]


def launch(expiry_ms: int = 30_000, ready_timeout: float = 30.0,
           extra_args: tuple[str, ...] = ()) -> NameServerProcess:
    child = spawn("namesrv", [*ledgermq_command(), "namesrv", "--listen", "127.0.0.1:0",
                              "--broker-expiry-ms", str(expiry_ms), "--log-level", "WARNING",
                              *extra_args],
                  LISTENING)
    m = child.wait_ready(ready_timeout)
    return NameServerProcess(child, m.group(1), int(m.group(2)))
