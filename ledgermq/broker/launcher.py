"""Run a NameServer and one broker group as child processes on loopback.

Used by `ledgermq dev`, `ledgermq demo`, the multi-process tests and the
benchmarks. Every child is started here and stopped here by its PID (SIGTERM,
then SIGKILL after a grace period), never by name. Ports are picked by binding
port 0 and releasing it just before the child binds it: a small race other
processes could win, acceptable on a test machine and reported clearly (the
child exits and `start` raises with its output). Children also get SIGTERM
when the thread that launched them dies, so call `start` and `start_node`
from a long-lived thread (the main thread), not a short-lived worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledgermq.base.ports import free_port
from ledgermq.broker.config import Peer, render_config

REPO = Path(__file__).resolve().parents[2]  # the repository root
_NAMESRV_READY = re.compile(r"namesrv listening on (\S+):(\d+)")
_BROKER_READY = re.compile(r"broker listening on (\S+):(\d+)")


@dataclass
class Child:
    """One child process, its output (also copied to `log_path`) and readiness."""

    name: str
    proc: subprocess.Popen[str]
    log_path: Path
    ready_pattern: re.Pattern[str]
    output: list[str] = field(default_factory=list)
    address: str | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def pump(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log_path, "a") as log_file:
            for line in self.proc.stdout:
                self.output.append(line)
                if len(self.output) > 2000:
                    del self.output[:1000]
                log_file.write(line)
                log_file.flush()
                if self.address is None and (m := self.ready_pattern.search(line)):
                    self.address = f"{m.group(1)}:{m.group(2)}"
                    self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float) -> str:
        self._ready.wait(timeout)
        if self.address is None:
            tail = "".join(self.output[-30:])
            raise RuntimeError(f"{self.name} did not start (exit {self.proc.poll()}):\n{tail}")
        return self.address

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM by PID, wait, SIGKILL if it will not go."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the launching thread dies
    (Linux prctl PR_SET_PDEATHSIG), so a launcher killed by SIGKILL or a test
    timeout does not leave a cluster running. Elsewhere: no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _spawn(name: str, args: list[str], log_path: Path, pattern: re.Pattern[str]) -> Child:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledgermq.cli", *args], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, env=env, cwd=REPO,
        # Own process group: a Ctrl-C in the terminal reaches the parent only,
        # which then stops every child in order.
        start_new_session=True, preexec_fn=_die_with_parent,
    )
    child = Child(name, proc, log_path, pattern)
    threading.Thread(target=child.pump, daemon=True, name=f"pump-{name}").start()
    return child


# Test- and demo-friendly Raft settings: 20 ms ticks, elections after ~300 ms.
FAST = {"tick_ms": 20, "election_timeout_ticks": 15, "heartbeat_interval_ticks": 2}


class LocalCluster:
    """A NameServer and a group of `nodes` brokers under `base_dir`."""

    def __init__(self, base_dir: str | Path, *, nodes: int = 3, group: str = "broker-a",
                 settings: dict[str, Any] | None = None, raft: dict[str, Any] | None = None,
                 log_level: str = "WARNING", namesrv_listen: str = "127.0.0.1:0",
                 admin_listen: str = "") -> None:
        """`admin_listen`: when set, the NameServer's HTTP admin app (API,
        metrics, dashboard) listens there and every broker gets one on a free
        loopback port."""
        self.base = Path(base_dir)
        self.namesrv_listen = namesrv_listen
        self.admin_listen = admin_listen
        self.nodes = nodes
        self.group = group
        self.settings = dict(settings or {})
        self.raft = {**FAST, **(raft or {})}
        self.log_level = log_level
        self.namesrv: Child | None = None
        self.brokers: dict[int, Child] = {}
        self.peers: dict[int, Peer] = {}
        self.config_paths: dict[int, Path] = {}

    @property
    def namesrv_address(self) -> str:
        assert self.namesrv is not None and self.namesrv.address is not None
        return self.namesrv.address

    def client_address(self, node_id: int) -> str:
        return self.peers[node_id].client

    def start(self, timeout: float = 60.0) -> LocalCluster:
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self.namesrv = _spawn(
                "namesrv", ["namesrv", "--listen", self.namesrv_listen,
                            "--broker-expiry-ms", "5000",
                            "--log-level", self.log_level,
                            *(["--admin-listen", self.admin_listen] if self.admin_listen
                              else [])],
                self.base / "logs" / "namesrv.log", _NAMESRV_READY)
            self.namesrv.wait_ready(timeout)
            self.peers = {nid: Peer(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
                          for nid in range(1, self.nodes + 1)}
            for nid in self.peers:
                self._write_config(nid)
            for nid in self.peers:
                self.start_node(nid, wait=False)
            for nid in self.peers:
                self.brokers[nid].wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _write_config(self, nid: int) -> None:
        values: dict[str, Any] = {
            "group": self.group, "node_id": nid, "data_dir": str(self.base / f"n{nid}"),
            "namesrv": [self.namesrv_address], "log_level": self.log_level,
            "namesrv_register_interval_ms": 500, "member_expiry_ms": 3000,
            **({"admin_listen": f"127.0.0.1:{free_port()}"} if self.admin_listen else {}),
            **self.settings,
        }
        path = self.base / f"n{nid}.toml"
        path.write_text(render_config(values, self.peers, self.raft))
        self.config_paths[nid] = path

    def start_node(self, nid: int, wait: bool = True, timeout: float = 60.0) -> Child:
        child = _spawn(f"n{nid}", ["broker", "--config", str(self.config_paths[nid])],
                       self.base / "logs" / f"n{nid}.log", _BROKER_READY)
        self.brokers[nid] = child
        if wait:
            child.wait_ready(timeout)
        return child

    def kill(self, nid: int, sig: int = signal.SIGKILL) -> None:
        child = self.brokers[nid]
        child.signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(10)

    def alive(self) -> list[int]:
        return [nid for nid, child in self.brokers.items() if child.alive]

    def pids(self) -> list[int]:
        children = [*self.brokers.values(), *([self.namesrv] if self.namesrv else [])]
        return [c.proc.pid for c in children]

    def stop(self) -> None:
        """Stop every child this cluster started, brokers first."""
        for child in list(self.brokers.values()):
            child.signal(signal.SIGTERM)
        for child in list(self.brokers.values()):
            child.stop()
        if self.namesrv is not None:
            self.namesrv.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def node_status(address: str, timeout: float = 1.0) -> dict[str, Any] | None:
    """BROKER_STATUS of one node, None if it does not answer."""
    from ledgermq.base.codes import RequestCode
    from ledgermq.wire import RpcClient

    host, _, port = address.rpartition(":")
    try:
        client = await RpcClient.connect(host, int(port), role="admin", timeout=timeout)
    except (OSError, ConnectionError, Exception):
        return None
    try:
        return await client.request(RequestCode.BROKER_STATUS, None)
    except Exception:
        return None
    finally:
        await client.close()


async def wait_admin_url(cluster: LocalCluster, nid: int, timeout: float = 10.0) -> str:
    """The admin app URL node `nid` reports once it serves (`admin_listen` set)."""
    import asyncio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = await node_status(cluster.client_address(nid))
        if status and status.get("admin_url"):
            return str(status["admin_url"])
        await asyncio.sleep(0.05)
    raise TimeoutError(f"node {nid} reported no admin URL")


async def wait_leader(cluster: LocalCluster, timeout: float = 30.0,
                      exclude: tuple[int, ...] = ()) -> int:
    """Poll the live nodes until one is a ready leader; its node id."""
    import asyncio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for nid in cluster.alive():
            if nid in exclude:
                continue
            status = await node_status(cluster.client_address(nid))
            if status and status.get("role") == "leader" and status.get("leader_ready"):
                return nid
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no ready leader among {cluster.alive()} within {timeout:g}s")
