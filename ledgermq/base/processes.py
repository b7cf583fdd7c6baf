"""Child processes for tests, benchmarks and `ledgermq dev`: spawn, wait until ready, stop.

One implementation for every launcher (the broker's `LocalCluster`, the Raft
node processes of `dledger.testing`, the NameServer test harness). A child's
output is read by a thread, kept in memory (and copied to a log file if
asked), and searched for the line that says it is ready. Every child is
signalled only by its own PID (SIGTERM, then SIGKILL after a grace period),
never by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from signal import SIGKILL, SIGTERM
from typing import TextIO

# The folder that holds the `ledgermq` package and its sibling packages (the
# repository root in a checkout). Children get it first on PYTHONPATH and as
# their working directory, so they run this tree's code even where an editable
# install points at another checkout.
SOURCE_ROOT = Path(__file__).resolve().parents[2]

_TAIL_LINES = 30  # of output, in the error for a child that did not start


def child_env() -> dict[str, str]:
    """This process's environment with SOURCE_ROOT first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@dataclass
class Child:
    """One child process, its output and its readiness (`ready_match`, the
    match of `ready` in the first line that has it)."""

    name: str
    proc: subprocess.Popen[str]
    ready: re.Pattern[str]
    log_path: Path | None = None
    keep_lines: int | None = None  # bound on `output` (older lines dropped)
    output: list[str] = field(default_factory=list)
    ready_match: re.Match[str] | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def pump(self) -> None:
        """Read the output to its end (runs in its own thread)."""
        if self.log_path is None:
            self._read(None)
        else:
            with open(self.log_path, "a") as log_file:
                self._read(log_file)
        self._ready.set()  # end of output: it will never be ready

    def _read(self, log_file: TextIO | None) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if self.keep_lines is not None and len(self.output) > self.keep_lines:
                del self.output[: self.keep_lines // 2]
            if log_file is not None:
                log_file.write(line)
                log_file.flush()
            if self.ready_match is None and (m := self.ready.search(line)):
                self.ready_match = m
                self._ready.set()

    def wait_ready(self, timeout: float) -> re.Match[str]:
        """The ready line's match; if the child exits or stays silent for
        `timeout` seconds first, it is killed and RuntimeError carries the
        tail of its output."""
        self._ready.wait(timeout)
        if self.ready_match is None:
            self.wait(0)  # kills it if it still runs
            tail = "".join(self.output[-_TAIL_LINES:])
            raise RuntimeError(f"{self.name} did not start (exit {self.proc.poll()}):\n{tail}")
        return self.ready_match

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        """Wait up to `timeout` seconds for the exit; then SIGKILL and wait
        for it (up to 10 s more). The exit code (negative: the signal)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(SIGKILL)
            return self.proc.wait(max(timeout, 10.0))

    def stop(self, sig: int = SIGTERM, grace: float = 10.0) -> int:
        """Send `sig` (SIGTERM), allow `grace` seconds, then SIGKILL."""
        self.signal(sig)
        return self.wait(grace)


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the launching thread dies
    (Linux prctl PR_SET_PDEATHSIG), so a launcher killed by SIGKILL or a test
    timeout does not leave children running. Elsewhere: no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def spawn(name: str, argv: list[str], ready: re.Pattern[str], *, log_path: Path | None = None,
          keep_lines: int | None = None, detach: bool = False) -> Child:
    """Start `argv` in SOURCE_ROOT with stdout and stderr read by a thread.

    `detach`: the child gets its own session (a Ctrl-C in the terminal
    reaches the parent only, which stops the children in order) and SIGTERM
    when the launching thread dies, so start it from a long-lived thread.
    """
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        text=True, env=child_env(), cwd=SOURCE_ROOT, start_new_session=detach,
        preexec_fn=_die_with_parent if detach else None,
    )
    child = Child(name, proc, ready, log_path, keep_lines)
    threading.Thread(target=child.pump, daemon=True, name=f"pump-{name}").start()
    return child


# ------------------------------------------------------- processes by PID only
#
# A rolling restart (`ledgermq cluster roll`) stops node processes another
# process started (`ledgermq dev`) and starts their replacements detached, so
# they outlive it. Such a process is known by its PID and its command line
# only; the command line is checked before every signal, so a PID the system
# reused for another program is never signalled.


def cmdline_of(pid: int) -> list[str] | None:
    """The command line of process `pid` (Linux /proc); None when there is no
    such process (or it is a zombie, whose command line is empty)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if not raw:
        return None
    return [part.decode(errors="replace") for part in raw.rstrip(b"\0").split(b"\0")]


@dataclass
class Running:
    """A process known by its PID and the command line it was started with
    (not necessarily a child of this process)."""

    name: str
    pid: int
    argv: list[str]
    log_path: Path | None = None

    @property
    def alive(self) -> bool:
        """Running, and still this program (not a zombie, not a reused PID)."""
        return cmdline_of(self.pid) == self.argv

    def signal(self, sig: int) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for it to end; True when it has."""
        deadline = time.monotonic() + timeout
        while self.alive:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def stop(self, sig: int = SIGTERM, grace: float = 10.0) -> None:
        """Send `sig` (SIGTERM), allow `grace` seconds, then SIGKILL and wait
        (up to 10 s more; RuntimeError if it still runs)."""
        self.signal(sig)
        if not self.wait(grace):
            self.signal(SIGKILL)
            if not self.wait(10.0):
                raise RuntimeError(f"{self.name} (pid {self.pid}) did not exit after SIGKILL")


def start_detached(name: str, argv: list[str], ready: re.Pattern[str], log_path: Path,
                   timeout: float) -> tuple[Running, re.Match[str]]:
    """Start `argv` in SOURCE_ROOT in a session of its own, its output
    appended to `log_path`, not tied to this process in any way (it outlives
    it), and wait until a line of its output matches `ready`. RuntimeError
    with the tail of its output if it exits or stays silent for `timeout`
    seconds first (it is stopped then)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        start = out.tell()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=child_env(), cwd=SOURCE_ROOT,
                                start_new_session=True)
    running = Running(name, proc.pid, list(argv), log_path)
    deadline = time.monotonic() + timeout
    while True:
        with open(log_path, "rb") as handle:
            handle.seek(start)
            text = handle.read().decode(errors="replace")
        if m := ready.search(text):
            return running, m
        if proc.poll() is not None or time.monotonic() >= deadline:
            if proc.poll() is None:
                running.stop()
            tail = "".join(text.splitlines(keepends=True)[-_TAIL_LINES:])
            raise RuntimeError(f"{name} did not start (exit {proc.poll()}):\n{tail}")
        time.sleep(0.05)
