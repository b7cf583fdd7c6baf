"""The start-up rule of docs/security.md, on real processes: without a
cluster secret a broker or NameServer listening off loopback refuses to start
(exit status 2, a message naming what listens where) unless told to run
open, which it then does with a loud warning; a secret file others may read
is refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ledgermq.base.ports import free_port
from ledgermq.base.processes import SOURCE_ROOT, child_env, spawn
from ledgermq.broker.config import Peer, render_config
from ledgermq.broker.launcher import FAST, LocalCluster
from ledgermq.wire.auth import write_secret_file

pytestmark = [pytest.mark.timeout(120)]


def _ledgermq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgermq.cli", *args], capture_output=True,
                          text=True, timeout=60, env=child_env(), cwd=SOURCE_ROOT)


def _broker_config(tmp_path: Path, raft: dict[str, object] | None = None,
                   **values: object) -> Path:
    peers = {1: Peer(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")}
    path = tmp_path / "n1.toml"
    path.write_text(render_config({"group": "g", "node_id": 1, "data_dir": str(tmp_path / "d"),
                                   **values}, peers, {**FAST, **(raft or {})}))
    return path


@pytest.mark.parametrize("where", ["client", "raft", "admin"])
def test_a_broker_off_loopback_without_a_secret_refuses_to_start(
        tmp_path: Path, where: str) -> None:
    wildcard = f"0.0.0.0:{free_port()}"
    values = {"client": {"listen": wildcard}, "raft": {},
              "admin": {"admin_listen": wildcard}}[where]
    raft = {"bind_host": "0.0.0.0"} if where == "raft" else None
    done = _ledgermq("broker", "--config", str(_broker_config(tmp_path, raft, **values)))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "refusing to start without authentication" in done.stderr
    assert "cluster_secret_file" in done.stderr and "allow_open" in done.stderr
    assert not (tmp_path / "d").exists()  # refused before touching the data directory


def test_a_broker_refuses_a_secret_file_others_can_read(tmp_path: Path) -> None:
    secret = tmp_path / "cluster.secret"
    write_secret_file(secret)
    os.chmod(secret, 0o644)
    done = _ledgermq("broker", "--config",
                     str(_broker_config(tmp_path, cluster_secret_file=str(secret))))
    assert done.returncode == 2
    assert "cluster_secret_file" in done.stderr and "chmod 600" in done.stderr


def test_allow_open_and_a_secret_let_a_broker_start_off_loopback(tmp_path: Path) -> None:
    # allow_open: runs, with a loud warning. Raft on every interface.
    with LocalCluster(tmp_path / "open", nodes=1, settings={"allow_open": True},
                      raft={"bind_host": "0.0.0.0"}, log_level="INFO") as cluster:
        assert cluster.alive() == [1]
    log = (tmp_path / "open" / "logs" / "n1.log").read_text()
    assert "RUNNING OPEN" in log and "Raft port on 0.0.0.0" in log
    # A cluster secret: authentication on, no warning needed.
    write_secret_file(tmp_path / "cluster.secret")
    with LocalCluster(tmp_path / "auth", nodes=1, raft={"bind_host": "0.0.0.0"},
                      settings={"cluster_secret_file": str(tmp_path / "cluster.secret")},
                      log_level="INFO") as cluster:
        assert cluster.alive() == [1]
    assert "RUNNING OPEN" not in (tmp_path / "auth" / "logs" / "n1.log").read_text()


def _namesrv_starts(*args: str) -> str:
    """Start `ledgermq namesrv ARGS`, wait until it listens, stop it by PID;
    its output."""
    child = spawn("namesrv", [sys.executable, "-m", "ledgermq.cli", "namesrv", *args],
                  re.compile(r"namesrv listening on (\S+):(\d+)"))
    try:
        child.wait_ready(30)
    finally:
        child.stop()
    return "".join(child.output)


def test_a_namesrv_off_loopback_needs_a_secret_or_allow_open(tmp_path: Path) -> None:
    done = _ledgermq("namesrv", "--listen", "0.0.0.0:0")
    assert done.returncode == 2
    # Errors go to stderr (rich may wrap the long line).
    said = " ".join(done.stderr.split())
    assert "refusing to start without authentication" in said
    assert "--cluster-secret-file" in said and "--allow-open" in said
    assert "RUNNING OPEN" in _namesrv_starts("--listen", "0.0.0.0:0", "--allow-open")
    secret = tmp_path / "cluster.secret"
    write_secret_file(secret)
    assert "RUNNING OPEN" not in _namesrv_starts("--listen", "0.0.0.0:0",
                                                 "--cluster-secret-file", str(secret))
    os.chmod(secret, 0o640)
    done = _ledgermq("namesrv", "--listen", "127.0.0.1:0", "--cluster-secret-file", str(secret))
    assert done.returncode == 2 and "chmod 600" in done.stderr
