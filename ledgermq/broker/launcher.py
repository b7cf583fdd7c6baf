"""Run a NameServer and one broker group as child processes on loopback.

Used by `ledgermq dev`, `ledgermq demo`, the multi-process tests and the
benchmarks. Every child is started and stopped by its PID through
`ledgermq.base.processes` (SIGTERM, then SIGKILL after a grace period). Ports are picked by binding
port 0 and releasing it just before the child binds it: a small race other
processes could win, acceptable on a test machine and reported clearly (the
child exits and `start` raises with its output). Children also get SIGTERM
when the thread that launched them dies, so call `start` and `start_node`
from a long-lived thread (the main thread), not a short-lived worker.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ledgermq.base.address import split_host_port
from ledgermq.base.ports import free_port
from ledgermq.base.processes import SOURCE_ROOT, Child, spawn
from ledgermq.broker.config import Peer, render_config

REPO = SOURCE_ROOT
_NAMESRV_READY = re.compile(r"namesrv listening on (\S+):(\d+)")
_BROKER_READY = re.compile(r"broker listening on (\S+):(\d+)")


def _spawn(name: str, args: list[str], log_path: Path, ready: re.Pattern[str]) -> Child:
    """Run `ledgermq <args>` detached (see `spawn`), its output copied to `log_path`."""
    return spawn(name, [sys.executable, "-m", "ledgermq.cli", *args], ready,
                 log_path=log_path, keep_lines=2000, detach=True)


def ready_address(child: Child, timeout: float) -> str:
    """HOST:PORT from the child's "listening on" line, once it is ready."""
    m = child.wait_ready(timeout)
    return f"{m.group(1)}:{m.group(2)}"


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
        assert self.namesrv is not None
        return ready_address(self.namesrv, 0)

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
                              else []),
                            *self._namesrv_security_args()],
                self.base / "logs" / "namesrv.log", _NAMESRV_READY)
            ready_address(self.namesrv, timeout)
            self.peers = {nid: Peer(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
                          for nid in range(1, self.nodes + 1)}
            for nid in self.peers:
                self._write_config(nid)
            for nid in self.peers:
                self.start_node(nid, wait=False)
            for nid in self.peers:
                ready_address(self.brokers[nid], timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _namesrv_security_args(self) -> list[str]:
        """The brokers' cluster secret and TLS files, given to the NameServer
        too: brokers with a cluster secret register only with a NameServer
        that proves it."""
        args = []
        for key in ("cluster_secret_file", "tls_cert_file", "tls_key_file", "tls_ca_file"):
            if self.settings.get(key):
                args += [f"--{key.replace('_', '-')}", str(self.settings[key])]
        return args

    @property
    def credentials(self) -> Any:
        """The cluster key's Credentials when the brokers have a cluster
        secret (what the status helpers below authenticate with), else None."""
        from ledgermq.wire.auth import CLUSTER_KEY, Credentials, read_secret_file

        path = self.settings.get("cluster_secret_file")
        return Credentials(CLUSTER_KEY, read_secret_file(path)) if path else None

    @property
    def client_tls(self) -> Any:
        """A TLS client context verifying the nodes against `tls_ca_file`, else None."""
        from ledgermq.wire.tls import client_context

        ca = self.settings.get("tls_ca_file")
        return client_context(str(ca)) if ca and self.settings.get("tls_cert_file") else None

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
            ready_address(child, timeout)
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
            child.signal(signal.SIGTERM)  # all at once: they stop in parallel
        for child in list(self.brokers.values()):
            child.stop()
        if self.namesrv is not None:
            self.namesrv.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def node_status(address: str, timeout: float = 1.0, *, credentials: Any = None,
                      tls: Any = None) -> dict[str, Any] | None:
    """BROKER_STATUS of one node, None if it does not answer. `credentials`,
    `tls`: for a cluster with authentication and TLS on (LocalCluster's
    `credentials` and `client_tls`)."""
    from ledgermq.base.codes import RequestCode
    from ledgermq.wire import RpcClient

    try:
        host, port = split_host_port(address)
        client = await RpcClient.connect(host, port, role="admin", timeout=timeout,
                                         credentials=credentials, ssl=tls)
    except Exception:  # a bad address, a refused or timed-out connection: no answer
        return None
    try:
        status: dict[str, Any] | None = await client.request(RequestCode.BROKER_STATUS, None)
        return status
    except Exception:
        return None
    finally:
        await client.close()


async def wait_admin_url(cluster: LocalCluster, nid: int, timeout: float = 10.0) -> str:
    """The admin app URL node `nid` reports once it serves (`admin_listen` set)."""
    import asyncio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = await node_status(cluster.client_address(nid),
                                   credentials=cluster.credentials, tls=cluster.client_tls)
        if status and status.get("admin_url"):
            return str(status["admin_url"])
        await asyncio.sleep(0.05)
    raise TimeoutError(f"node {nid} reported no admin URL")


async def wait_leader(cluster: LocalCluster, timeout: float = 30.0,
                      exclude: tuple[int, ...] = ()) -> int:
    """Poll the live nodes until one is a ready leader; its node id."""
    import asyncio

    deadline = time.monotonic() + timeout
    credentials, tls = cluster.credentials, cluster.client_tls
    while time.monotonic() < deadline:
        for nid in cluster.alive():
            if nid in exclude:
                continue
            status = await node_status(cluster.client_address(nid), credentials=credentials,
                                       tls=tls)
            if status and status.get("role") == "leader" and status.get("leader_ready"):
                return nid
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no ready leader among {cluster.alive()} within {timeout:g}s")
