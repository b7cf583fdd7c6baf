"""Run `ledgermq namesrv` as a real subprocess on an ephemeral port (test helper).

Shared by the NameServer tests and, later, by broker and client tests that need
a NameServer to register with.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"namesrv listening on (\S+):(\d+)")


@dataclass
class NameServerProcess:
    proc: subprocess.Popen[str]
    host: str
    port: int
    output: list[str]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signal the process by PID and wait for it; kill it if it will not stop."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        return self.proc.returncode


def ledgermq_command() -> list[str]:
    """How to run the `ledgermq` console script of this virtualenv."""
    script = Path(sys.executable).parent / "ledgermq"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ledgermq.cli"]


def launch(expiry_ms: int = 30_000, ready_timeout: float = 30.0) -> NameServerProcess:
    env = dict(os.environ)
    # The package may be newer than the editable install's module map.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [
            *ledgermq_command(),
            "namesrv",
            "--listen",
            "127.0.0.1:0",
            "--broker-expiry-ms",
            str(expiry_ms),
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + ready_timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            line = lines.get(timeout=max(0.0, remaining))
        except queue.Empty:
            line = None
        if line is not None and (m := LISTENING.search(line)):
            return NameServerProcess(proc, m.group(1), int(m.group(2)), output)
        if line is None:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            raise RuntimeError(f"namesrv did not start: {''.join(output)}")
