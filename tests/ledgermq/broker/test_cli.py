"""The CLI as a user runs it: `ledgermq dev`, topic, send, consume, status, demo.

Real subprocesses; the children `dev` and `demo` start must all be gone
afterwards (checked by the PIDs they print).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from ledgermq.broker.launcher import REPO, free_port

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def cli(*args: str, timeout: float = 60,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200", **(env or {}))
    return subprocess.run([sys.executable, "-m", "ledgermq.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie of someone else's would still answer; ours are reaped by their parent.
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] == "Z"


def wait_gone(pids: list[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(gone(p) for p in pids):
        assert time.monotonic() < deadline, f"children still running: {pids}"
        time.sleep(0.05)


def test_demo_refuses_an_even_group_before_starting_anything(tmp_path) -> None:
    result = cli("demo", "--dir", str(tmp_path / "demo"), "--nodes", "4")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "an odd number (3, 5 or 7)" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "demo").exists()


def test_demo_exits_zero_and_stops_its_children(tmp_path) -> None:
    result = cli("demo", "--dir", str(tmp_path / "demo"), "--messages", "600", timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"lost\s+│\s+0\b", result.stdout)
    assert "new leader: n" in result.stdout
    # With authentication on (`make run` shows the secured path): the demo's
    # clients signed in with the secrets generated under its directory.
    assert "authentication on: clients sign in as 'admin'" in result.stdout
    for name in ("cluster.secret", "admin.secret"):
        assert (tmp_path / "demo" / "secrets" / name).stat().st_mode & 0o077 == 0
    pids = [int(p) for p in re.search(r"pids \[([\d, ]+)\]", result.stdout).group(1).split(",")]
    assert len(pids) == 4
    wait_gone(pids)


def test_dev_cluster_with_topic_send_consume_status(tmp_path) -> None:
    port = free_port()
    ns = f"127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    dev = subprocess.Popen(
        [sys.executable, "-m", "ledgermq.cli", "dev", "--dir", str(tmp_path / "dev"),
         "--namesrv", ns], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, cwd=REPO)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert dev.stdout is not None
        for line in dev.stdout:
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(60) and dev.poll() is None, "".join(lines)
        pids = [int(m.group(1)) for line in lines
                if (m := re.search(r"(?:namesrv|broker n\d[^│]*)\s*│\s*(\d+)", line))]
        assert len(pids) == 4, "".join(lines)
        # dev runs with authentication on and prints the two variables to export.
        creds = dict(line.split()[1].split("=", 1) for line in lines
                     if line.startswith("export LEDGERMQ_"))
        assert set(creds) == {"LEDGERMQ_ACCESS_KEY", "LEDGERMQ_SECRET_FILE"}, "".join(lines)
        refused = cli("topic", "create", "clitopic", "--queues", "2", "--namesrv", ns)
        assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr, refused

        def as_admin(*args: str) -> subprocess.CompletedProcess[str]:
            return cli(*args, env=creds)

        created = as_admin("topic", "create", "clitopic", "--queues", "2", "--namesrv", ns)
        assert created.returncode == 0 and "2 queues" in created.stdout, created.stderr
        sent = as_admin("send", "clitopic", "one", "two", "three", "--tags", "x",
                        "--namesrv", ns)
        assert sent.returncode == 0, sent.stderr
        assert len(re.findall(r"broker-a@[0-9A-F]{16}", sent.stdout)) == 3
        deadline = time.monotonic() + 30
        while "clitopic" not in (listed := as_admin("topic", "list", "--namesrv", ns)).stdout:
            assert time.monotonic() < deadline, listed.stdout + listed.stderr
        assert re.search(r"clitopic.*broker-a.*2.*6.*3", listed.stdout)
        consumed = as_admin("consume", "clitopic", "--group", "g", "--count", "3",
                            "--namesrv", ns)
        assert consumed.returncode == 0, consumed.stderr
        assert {"one", "two", "three"} <= set(re.findall(r"\b(one|two|three)\b",
                                                         consumed.stdout))
        status = as_admin("status", "--namesrv", ns)
        assert status.returncode == 0 and status.stdout.count("leader") >= 1, status.stderr
        assert status.stdout.count("follower") == 2
        described = as_admin("topic", "describe", "clitopic", "--namesrv", ns)
        assert described.returncode == 0 and "min offset" in described.stdout
    finally:
        if dev.poll() is None:
            os.kill(dev.pid, signal.SIGINT)
        dev.wait(60)
    assert dev.returncode == 0, "".join(lines)
    wait_gone(pids)


def _sigint_as_at_a_terminal() -> None:
    # A job that a non-interactive shell starts in the background (`cmd &`),
    # and everything it runs, inherits SIGINT ignored, and Python keeps it
    # ignored (no KeyboardInterrupt): a suite started that way sent its
    # Ctrl-C to a demo that could not hear it, which then ran to its end.
    # The user this test stands for presses Ctrl-C at a terminal, where
    # SIGINT has its default action.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_demo_ctrl_c_stops_every_child(tmp_path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="200")
    demo = subprocess.Popen(
        [sys.executable, "-m", "ledgermq.cli", "demo", "--dir", str(tmp_path / "demo"),
         "--messages", "200000"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, cwd=REPO, preexec_fn=_sigint_as_at_a_terminal)
    lines: list[str] = []
    up = threading.Event()

    def pump() -> None:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if "pids [" in "".join(lines[-2:]):
                up.set()
        up.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert up.wait(60) and demo.poll() is None, "".join(lines)
        text = "".join(lines)
        pids = [int(p) for p in re.search(r"pids \[([\d, ]+)\]", text).group(1).split(",")]
        os.kill(demo.pid, signal.SIGINT)
        demo.wait(60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
    assert demo.returncode == 130, "".join(lines)
    wait_gone(pids)
