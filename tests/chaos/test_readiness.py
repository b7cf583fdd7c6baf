"""Readiness from a real PING, never from an open port or a live PID alone."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from chaos import readiness
from ledgermq.base.ports import free_port

pytestmark = pytest.mark.timeout(60)


def test_a_live_nameserver_answers_and_is_ready(tmp_path: Path) -> None:
    log = tmp_path / "namesrv.log"
    address = f"127.0.0.1:{free_port()}"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "ledgermq.cli", "namesrv", "--listen",
                                 address], stdout=fh, stderr=subprocess.STDOUT)
    try:
        ready = readiness.wait_ready("namesrv", exit_status=proc.poll,
                                     answers=lambda: readiness.ping(address),
                                     tail=lambda: readiness.log_tail(log), timeout=30.0)
        assert ready.ready and ready.exit_status is None, ready
    finally:
        proc.terminate()
        proc.wait(10)
    # Now it is gone: the answer says so, with its exit status.
    gone = readiness.wait_ready("namesrv", exit_status=proc.poll,
                                answers=lambda: readiness.ping(address),
                                tail=lambda: readiness.log_tail(log), timeout=5.0)
    assert not gone.ready and gone.exit_status == proc.returncode
    assert any("namesrv listening on" in line for line in gone.log_tail)


def test_an_open_port_that_does_not_speak_the_protocol_is_not_ready(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    stop = threading.Event()

    def accept_and_hang_up() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.close()

    thread = threading.Thread(target=accept_and_hang_up, daemon=True)
    thread.start()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        result = readiness.wait_ready("n1", exit_status=sleeper.poll,
                                      answers=lambda: readiness.ping(address, 1.0),
                                      tail=lambda: ("last line",), timeout=1.0, interval=0.1)
    finally:
        sleeper.kill()
        sleeper.wait(10)
        stop.set()
        thread.join(5)
        listener.close()
    assert not result.ready and result.exit_status is None
    assert result.reason.startswith("alive but no PING answer within 1 s")
    assert result.log_tail == ("last line",)


def test_log_tail_reads_only_what_the_latest_start_wrote(tmp_path: Path) -> None:
    log = tmp_path / "n1.log"
    log.write_text("old run\nbroker listening on 127.0.0.11:9000\n")
    start = log.stat().st_size
    with open(log, "a") as fh:
        fh.write("".join(f"line {i}\n" for i in range(30)))
    tail = readiness.log_tail(log, start)
    assert tail == tuple(f"line {i}" for i in range(10, 30))
    assert readiness.log_tail(tmp_path / "missing.log") == ()
