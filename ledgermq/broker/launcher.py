"""Run a NameServer and one broker group as child processes on loopback.

Used by `ledgermq dev`, `ledgermq demo`, the multi-process tests and the
benchmarks. Every child is started and stopped by its PID through
`ledgermq.base.processes` (SIGTERM, then SIGKILL after a grace period). Ports are picked by binding
port 0 and releasing it just before the child binds it: a small race other
processes could win, acceptable on a test machine and reported clearly (the
child exits and `start` raises with its output). Children also get SIGTERM
when the thread that launched them dies, so call `start` and `start_node`
from a long-lived thread (the main thread), not a short-lived worker.

`secure=True` runs the cluster with authentication on: a cluster secret and
a bootstrap administrator's secret are generated under `<base>/secrets/` at
the first start (0600, never overwritten) and reused by later starts on the
same directory; `admin_credentials` is what a client (`ledgermq dev`'s user,
the demo) authenticates with.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ledgermq.base.address import split_host_port
from ledgermq.base.ports import free_port
from ledgermq.base.processes import SOURCE_ROOT, Child, Running, spawn
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


SECRETS_DIR = "secrets"
CLUSTER_SECRET = "cluster.secret"
ADMIN_SECRET = "admin.secret"
ADMIN_ACCESS_KEY = "admin"


def ensure_secret(path: Path) -> bool:
    """Make sure `path` holds a secret: generate one (0600) when the file is
    missing. True when it was generated now. An existing file is kept as it
    is and checked (`read_secret_file` refuses one that others may read)."""
    from ledgermq.wire.auth import read_secret_file, write_secret_file

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        write_secret_file(path)
    except FileExistsError:
        read_secret_file(path)
        return False
    return True


# `<base>/cluster.json`: what a started cluster looks like from outside (the
# processes by PID and command line, their addresses, the security files),
# for `ledgermq cluster roll --dir <base>` (ledgermq/cli/rolling.py), which
# restarts nodes detached and records their new PIDs here.
MANIFEST = "cluster.json"
_MANIFEST_SETTINGS = ("cluster_secret_file", "admin_secret_file", "admin_access_key",
                      "admin_token", "tls_ca_file", "tls_cert_file")


def read_manifest(base: str | Path) -> dict[str, Any]:
    """The manifest of the cluster started under `base` (FileNotFoundError if none)."""
    with open(Path(base) / MANIFEST) as handle:
        manifest: dict[str, Any] = json.load(handle)
    return manifest


def write_manifest(base: str | Path, manifest: dict[str, Any]) -> None:
    """Replace the manifest atomically (readers never see half of it)."""
    path = Path(base) / MANIFEST
    tmp = path.with_name(f"{MANIFEST}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, path)


def manifest_process(name: str, entry: dict[str, Any]) -> Running:
    """The process a manifest entry describes (alive only while its PID still runs its
    command line)."""
    return Running(name, int(entry["pid"]), [str(a) for a in entry["argv"]],
                   Path(entry["log"]) if entry.get("log") else None)


# Test- and demo-friendly Raft settings: 20 ms ticks, elections after ~300 ms.
FAST = {"tick_ms": 20, "election_timeout_ticks": 15, "heartbeat_interval_ticks": 2}


class LocalCluster:
    """A NameServer and a group of `nodes` brokers under `base_dir`."""

    def __init__(self, base_dir: str | Path, *, nodes: int = 3, group: str = "broker-a",
                 settings: dict[str, Any] | None = None, raft: dict[str, Any] | None = None,
                 log_level: str = "WARNING", namesrv_listen: str = "127.0.0.1:0",
                 admin_listen: str = "", secure: bool = False) -> None:
        """`admin_listen`: when set, the NameServer's HTTP admin app (API,
        metrics, dashboard) listens there and every broker gets one on a free
        loopback port. `secure`: authentication on, with the secrets of
        `secret_paths` (generated by `start` when missing); the settings'
        own `cluster_secret_file`/`admin_secret_file` win over them."""
        self.base = Path(base_dir)
        self.secure = secure
        self.namesrv_listen = namesrv_listen
        self.admin_listen = admin_listen
        self.nodes = nodes
        self.group = group
        self.settings = dict(settings or {})
        self.generated: list[Path] = []  # the secrets the last `start` created
        if secure:
            cluster_file, admin_file = self.secret_paths
            self.settings.setdefault("cluster_secret_file", str(cluster_file))
            self.settings.setdefault("admin_secret_file", str(admin_file))
        self.raft = {**FAST, **(raft or {})}
        self.log_level = log_level
        self.namesrv: Child | None = None
        self.brokers: dict[int, Child] = {}
        self.peers: dict[int, Peer] = {}
        self.config_paths: dict[int, Path] = {}
        self._recorded = False  # the manifest describes this cluster

    @property
    def namesrv_address(self) -> str:
        assert self.namesrv is not None
        return ready_address(self.namesrv, 0)

    def client_address(self, node_id: int) -> str:
        return self.peers[node_id].client

    @property
    def secret_paths(self) -> tuple[Path, Path]:
        """Where `secure` keeps the cluster secret and the bootstrap
        administrator's secret."""
        secrets_dir = self.base / SECRETS_DIR
        return secrets_dir / CLUSTER_SECRET, secrets_dir / ADMIN_SECRET

    def start(self, timeout: float = 60.0) -> LocalCluster:
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        if self.secure:
            # Before any child starts: they read the files at start-up.
            self.generated = [Path(self.settings[key]) for key in
                              ("cluster_secret_file", "admin_secret_file")
                              if ensure_secret(Path(self.settings[key]))]
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
            self._record(None)
            self._recorded = True
        except BaseException:
            self.stop()
            raise
        return self

    def _namesrv_security_args(self) -> list[str]:
        """The brokers' cluster secret and TLS files, given to the NameServer
        too: brokers with a cluster secret register only with a NameServer
        that proves it."""
        args = []
        for key in ("cluster_secret_file", "admin_access_key", "admin_secret_file",
                    "tls_cert_file", "tls_key_file", "tls_ca_file"):
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
    def admin_credentials(self) -> Any:
        """The bootstrap administrator's Credentials (what a user of the
        cluster authenticates with) when `admin_secret_file` is set, else None."""
        from ledgermq.wire.auth import Credentials, read_secret_file

        path = self.settings.get("admin_secret_file")
        key = self.settings.get("admin_access_key", ADMIN_ACCESS_KEY)
        return Credentials(key, read_secret_file(path)) if path else None

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
        child = spawn(f"n{nid}", self.broker_argv(nid), _BROKER_READY,
                      log_path=self.base / "logs" / f"n{nid}.log", keep_lines=2000, detach=True)
        self.brokers[nid] = child
        if wait:
            ready_address(child, timeout)
        if self._recorded:  # a restart after `start`: its new PID
            self._record(nid)
        return child

    def broker_argv(self, nid: int) -> list[str]:
        """The command `start_node` runs node `nid` with."""
        return [sys.executable, "-m", "ledgermq.cli", "broker", "--config",
                str(self.config_paths[nid])]

    def _record(self, nid: int | None) -> None:
        """Write node `nid`'s process into the manifest (None: every process)."""
        assert self.namesrv is not None
        try:
            manifest = read_manifest(self.base) if nid is not None else {}
        except FileNotFoundError:
            manifest = {}
        manifest.update({
            "group": self.group, "base": str(self.base),
            "namesrv": {"pid": self.namesrv.proc.pid, "address": self.namesrv_address},
            "settings": {k: str(self.settings[k]) for k in _MANIFEST_SETTINGS
                         if self.settings.get(k)},
        })
        nodes = manifest.setdefault("nodes", {})
        for n in ([nid] if nid is not None else sorted(self.brokers)):
            child = self.brokers[n]
            nodes[str(n)] = {"pid": child.proc.pid, "argv": self.broker_argv(n),
                             "config": str(self.config_paths[n]),
                             "log": str(self.base / "logs" / f"n{n}.log"),
                             "client": self.peers[n].client, "raft": self.peers[n].raft}
        write_manifest(self.base, manifest)

    def replacements(self) -> dict[int, Running]:
        """Nodes a rolling restart (`ledgermq cluster roll`) started again
        in place of this cluster's children, still running."""
        try:
            nodes = read_manifest(self.base).get("nodes", {})
        except (FileNotFoundError, ValueError):
            return {}
        found = {}
        for key, entry in nodes.items():
            child = self.brokers.get(int(key))
            if child is not None and int(entry["pid"]) != child.proc.pid:
                process = manifest_process(f"n{key}", entry)
                if process.alive:
                    found[int(key)] = process
        return found

    def kill(self, nid: int, sig: int = signal.SIGKILL) -> None:
        replaced = self.replacements().get(nid)
        if replaced is not None:  # restarted by a roll: signal what runs now
            replaced.signal(sig)
            replaced.wait(10)
            return
        child = self.brokers[nid]
        child.signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(10)

    def alive(self) -> list[int]:
        """The nodes running: this cluster's children, or what replaced them."""
        replaced = self.replacements()
        return [nid for nid, child in self.brokers.items() if child.alive or nid in replaced]

    def pids(self) -> list[int]:
        children = [*self.brokers.values(), *([self.namesrv] if self.namesrv else [])]
        return [c.proc.pid for c in children]

    def stop(self) -> None:
        """Stop every child this cluster started, brokers first."""
        for child in list(self.brokers.values()):
            child.signal(signal.SIGTERM)  # all at once: they stop in parallel
        for child in list(self.brokers.values()):
            child.stop()
        for process in self.replacements().values():
            process.stop()
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
