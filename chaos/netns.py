"""The netns backend: every node a process in one private network namespace.

Topology (verified on a kernel without netem): one namespace per run, its
loopback up; the NameServer and the clients on 127.0.0.1, node N on
127.0.0.(10+N), each binding its outgoing Raft sockets to its own address
(the broker's Raft bind host defaults to the host of its own Raft address),
so every packet between two nodes carries both nodes' addresses and an
iptables rule on the pair cuts exactly that link.

Faults:
- links: DROP rules in a chain of our own (`LMQ-CHAOS-<pid>`) hooked into the
  namespace's INPUT; heal flushes only that chain. Loss is the same rule with
  `-m statistic --mode random --probability P`.
- delay/jitter/bandwidth: `chaos.proxy` per directed link, only when the run
  was started with `proxied=True` (node A's peer list then names the proxy on
  A's address instead of B's Raft port). Without it, shaping is refused.
- kill/pause: signals to the node's PID (`ip netns exec` execs, so the PID
  we hold is the broker's).
- security (`spec.secure`): the run's secrets and one certificate for
  127.0.0.1 and every node address under `security/` (chaos.security); the
  NameServer and every node get the cluster secret, the admin secret and the
  certificate, so Raft, registrations and clients all authenticate over TLS.
- readiness: the process is alive and answers PING on its client address,
  asked from a thread inside the namespace (chaos.readiness); never a line
  of its log, which a crash's traceback can contain.
- clock: libfaketime preloaded with a per-node timestamp file the harness
  rewrites; FAKETIME_DONT_FAKE_MONOTONIC=1 keeps monotonic time real.
- power loss and file faults: the node's data directory, under the run's
  `data/<group>/n<N>/` (see `chaos.disk_faults`).
- membership changes (`spec.spares`, `spec.admin`): spares get addresses
  127.0.0.(10+N) like every node and are in every node's `[peers]`, not in
  `initial_members`; they start only when a nemesis starts them. Admin apps
  listen on 127.0.0.1:8080 (NameServer) and 127.0.0.(10+N):8080 (nodes).
  A wiped or removed node's data directory is moved under the run's
  `wiped/` or `removed/` (never deleted). Not with proxied links: a
  member's Raft address is one address in the group's configuration, while
  the proxy needs one per source node.

Teardown (`close`, also from atexit and after Ctrl-C) kills only the PIDs this
backend started, removes its chain and deletes its namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from chaos import readiness
from chaos.backend import Backend, CannotInject, ClusterSpec
from chaos.proxy import Link, LinkProxy, Shape
from chaos.readiness import Readiness
from chaos.security import generate
from ledgermq.broker.config import Peer, render_config

REPO = Path(__file__).resolve().parents[1]
CLONE_NEWNET = 0x40000000
RAFT_PORT = 7000
CLIENT_PORT = 9000
PROXY_PORT_BASE = 7100
ADMIN_PORT = 8080
NAMESRV = "127.0.0.1:9876"
NAMESRV_ADMIN = "127.0.0.1:8080"


def node_ip(node: int) -> str:
    return f"127.0.0.{10 + node}"


def faketime_library() -> str | None:
    """The libfaketime shared object: from the PyPI wheel, else from the OS package."""
    with contextlib.suppress(ImportError):
        import libfaketime

        base = Path(libfaketime.__file__).parent / "vendor"
        for found in sorted(base.rglob("libfaketime.so.1")):
            return str(found)
    for candidate in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                      "/usr/lib/faketime/libfaketime.so.1"):
        if os.path.exists(candidate):
            return candidate
    return None


def enter_namespace(name: str) -> None:
    """Move the *calling thread* into network namespace `name` (setns is per thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def netns_available() -> str | None:
    """None if this machine can run the netns backend, else why not."""
    if os.geteuid() != 0:
        return "the netns backend needs root (network namespaces, iptables)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


class NetnsBackend(Backend):
    def __init__(self, spec: ClusterSpec, out: str | Path, *, log: Callable[[str], None] = print,
                 seed: int = 0) -> None:
        run = self.run_number()
        self.spec = spec
        self.out = Path(out)
        self.log = log
        self.seed = seed
        self.ns = f"lmq-chaos-{os.getpid()}-{run}"
        self.chain = f"LMQ-CHAOS-{os.getpid()}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._log_files: list[IO[bytes]] = []
        self._log_from: dict[str, int] = {}  # log size when each process last started
        self._caps: dict[str, str | None] = {}
        self._created = False
        self._proxy: LinkProxy | None = None
        self._proxy_loop: asyncio.AbstractEventLoop | None = None
        self._proxy_thread: threading.Thread | None = None
        self._faketime = faketime_library()
        self._closed = False
        self._set_aside = 0  # numbers the directories moved out of data/

    # ------------------------------------------------------------ environment

    def _sh(self, *argv: str, check: bool = True,
            ns: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["ip", "netns", "exec", self.ns, *argv] if ns else list(argv)
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): "
                               f"{result.stderr.strip()}")
        return result

    def create_namespace(self) -> None:
        """The namespace, its loopback and our chain; then probe what can be injected."""
        reason = netns_available()
        if reason:
            raise CannotInject(reason)
        self._register()
        self._sh("ip", "netns", "add", self.ns, ns=False)
        self._created = True
        self._sh("ip", "link", "set", "lo", "up")
        self._sh("iptables", "-w", "-N", self.chain)
        self._sh("iptables", "-w", "-I", "INPUT", "-j", self.chain)
        self._probe()

    def _probe(self) -> None:
        caps: dict[str, str | None] = {k: None for k in
                                       ("partition", "kill", "pause", "power-loss", "file")}
        probe = self._sh("iptables", "-w", "-A", self.chain, "-s", "127.0.0.254", "-m",
                         "statistic", "--mode", "random", "--probability", "0.5", "-j", "DROP",
                         check=False)
        caps["loss"] = None if probe.returncode == 0 else \
            f"iptables statistic match unavailable: {probe.stderr.strip()}"
        self._sh("iptables", "-w", "-F", self.chain)
        netem = self._sh("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                         check=False) if shutil.which("tc") else None
        self.netem = netem is not None and netem.returncode == 0
        if self.netem:
            self._sh("tc", "qdisc", "del", "dev", "lo", "root", check=False)
        caps["delay"] = None if self.spec.proxied else (
            "links are not proxied in this run (start it with a delay nemesis selected, "
            "which routes Raft traffic through the userspace proxy"
            + ("" if self.netem else "; the kernel has no netem either") + ")")
        if self._faketime is None:
            caps["clock"] = "libfaketime not found (pip install libfaketime, or apt faketime)"
        elif not self.spec.faketime:
            caps["clock"] = "nodes were not started under libfaketime in this run"
        else:
            caps["clock"] = None
        if not self.spec.admin:
            caps["membership"] = "the run was started without admin apps (no membership nemesis)"
        elif self.spec.proxied:
            caps["membership"] = ("membership changes cannot be combined with the delay proxy: "
                                  "a member's Raft address is one address in the group's "
                                  "configuration, the proxy needs one per source node")
        else:
            caps["membership"] = None
        self._caps = caps
        for fault, why in sorted(caps.items()):
            if why is not None:
                self.log(f"chaos: CANNOT INJECT {fault}: {why}")
        if not self.netem:
            self.log("chaos: kernel has no netem qdisc; delay/jitter/bandwidth use the "
                     "userspace link proxy")

    def capabilities(self) -> dict[str, str | None]:
        return dict(self._caps)

    def start(self) -> None:
        try:
            self.create_namespace()
            (self.out / "logs").mkdir(parents=True, exist_ok=True)
            (self.out / "config").mkdir(parents=True, exist_ok=True)
            if self.spec.proxied:
                self._start_proxy()
            namesrv_security: list[str] = []
            if self.spec.secure:
                # Every address a client or a peer dials: the NameServer's, each node's.
                self.security = generate(self.out / "security", [
                    NAMESRV.rsplit(":", 1)[0], *(node_ip(n) for n in self.all_node_ids)])
                namesrv_security = self.security.namesrv_args()
            if self.spec.admin:
                namesrv_security += ["--admin-listen", NAMESRV_ADMIN]
            self._spawn("namesrv", [sys.executable, "-m", "ledgermq.cli", "namesrv", "--listen",
                                    NAMESRV, "--broker-expiry-ms", "5000", "--log-level",
                                    "WARNING", *namesrv_security], clock_file=None)
            for node in self.all_node_ids:
                self._write_config(node)
                if self._faketime and self.spec.faketime:
                    self.set_clock_offset(node, 0.0)
            namesrv = self._wait("namesrv", NAMESRV, 30.0)
            if not namesrv.ready:
                raise RuntimeError(f"the NameServer did not start: {namesrv.reason}\n"
                                   + "\n".join(namesrv.log_tail))
            for node in self.node_ids:
                self.start_node(node)
            for node in self.node_ids:
                ready = self.wait_node(node, 60.0)
                if not ready.ready:
                    raise RuntimeError(f"node {node} did not start: {ready.reason}; see "
                                       f"{self._log_path(node)}\n" + "\n".join(ready.log_tail))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for fh in self._log_files:
            with contextlib.suppress(Exception):
                fh.close()
        self._stop_proxy()
        if self._created:
            self._sh("iptables", "-w", "-F", self.chain, check=False)
            self._sh("iptables", "-w", "-D", "INPUT", "-j", self.chain, check=False)
            self._sh("iptables", "-w", "-X", self.chain, check=False)
            self._sh("ip", "netns", "del", self.ns, check=False, ns=False)
            self._created = False
        self._unregister()

    # ------------------------------------------------------------ processes

    def _log_path(self, node: int | str) -> Path:
        name = node if isinstance(node, str) else f"n{node}"
        return self.out / "logs" / f"{name}.log"

    def _clock_file(self, node: int) -> Path:
        return self.out / "config" / f"n{node}.faketime"

    def _spawn(self, name: str, argv: list[str], clock_file: Path | None) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        if self.spec.durability_trace:
            env["LEDGERMQ_DURABILITY_TRACE"] = "1"
        if clock_file is not None and self._faketime and self.spec.faketime:
            env.update({"LD_PRELOAD": self._faketime,
                        "FAKETIME_TIMESTAMP_FILE": str(clock_file),
                        "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
        path = self._log_path(name)
        self._log_from[name] = path.stat().st_size if path.exists() else 0
        fh = open(path, "ab")  # noqa: SIM115 - closed in close()
        fh.write(f"=== chaos: start {name} at {time.time():.3f} ===\n".encode())
        fh.flush()
        self._log_files.append(fh)
        old = self.procs.get(name)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"{name} is still running (pid {old.pid})")
        self.procs[name] = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *argv], stdout=fh, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=env, cwd=REPO, start_new_session=True)

    def _wait(self, name: str, address: str, timeout: float) -> Readiness:
        """Until process `name` is alive and answers PING at `address` (or exits)."""
        proc = self.procs[name]
        start = self._log_from.get(name, 0)
        security = self.client_security
        if name == "namesrv":
            security = security.anonymous()  # its client port knows only the cluster key
        return readiness.wait_ready(
            name, exit_status=proc.poll,
            answers=lambda: readiness.ping(address, 2.0, self.client_thread_init(), security),
            tail=lambda: readiness.log_tail(self._log_path(name), start), timeout=timeout)

    def _write_config(self, node: int, bootstrap: list[int] | None = None) -> None:
        """Node `node`'s TOML. `bootstrap`: its `initial_members` (default: the
        run's original nodes when it has spares; else every node, the default)."""
        s = self.spec
        values: dict[str, object] = {
            "group": s.group, "node_id": node, "data_dir": str(self.data_dir(node)),
            "namesrv": [NAMESRV], "flush": s.flush, "replicate": s.replicate,
            "log_level": s.log_level, "segment_size_bytes": s.segment_size_bytes,
            "namesrv_register_interval_ms": 500, "member_expiry_ms": 3000,
            **(self.security.broker_settings() if self.security else {}), **s.extra}
        if bootstrap is not None or s.spares:
            values["initial_members"] = list(bootstrap if bootstrap is not None
                                             else s.original_ids)
        if s.admin:
            values["admin_listen"] = f"{node_ip(node)}:{ADMIN_PORT}"
        raft = {"tick_ms": s.tick_ms, "election_timeout_ticks": s.election_timeout_ticks,
                "heartbeat_interval_ticks": s.heartbeat_interval_ticks}
        peers = {}
        for peer in self.all_node_ids:
            address = f"{node_ip(peer)}:{RAFT_PORT}"
            if s.proxied and peer != node:
                address = f"{node_ip(node)}:{PROXY_PORT_BASE + peer}"
            peers[peer] = Peer(raft=address, client=f"{node_ip(peer)}:{CLIENT_PORT}")
        (self.out / "config" / f"n{node}.toml").write_text(render_config(values, peers, raft))

    def start_node(self, node: int) -> None:
        self.data_dir(node).mkdir(parents=True, exist_ok=True)
        self._spawn(f"n{node}", [sys.executable, "-m", "ledgermq.cli", "broker", "--config",
                                 str(self.out / "config" / f"n{node}.toml")],
                    clock_file=self._clock_file(node))

    def wait_node(self, node: int, timeout: float) -> Readiness:
        return self._wait(f"n{node}", self.client_address(node), timeout)

    def signal_node(self, node: int, sig: int) -> None:
        proc = self.procs.get(f"n{node}")
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, sig)

    def node_alive(self, node: int) -> bool:
        proc = self.procs.get(f"n{node}")
        return proc is not None and proc.poll() is None

    def node_pid(self, node: int) -> int | None:
        proc = self.procs.get(f"n{node}")
        return proc.pid if proc is not None and proc.poll() is None else None

    def wait_node_exit(self, node: int, timeout: float) -> bool:
        proc = self.procs.get(f"n{node}")
        if proc is None:
            return True
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def data_dir(self, node: int) -> Path:
        return self.out / "data" / self.spec.group / f"n{node}"

    # ------------------------------------------------------------ membership

    def admin_url(self, node: int) -> str:
        self.require("membership")
        scheme = "https" if self.security is not None else "http"
        return f"{scheme}://{node_ip(node)}:{ADMIN_PORT}"

    @property
    def namesrv_admin_url(self) -> str:
        self.require("membership")
        scheme = "https" if self.security is not None else "http"
        return f"{scheme}://{NAMESRV_ADMIN}"

    def raft_address(self, node: int) -> str:
        return f"{node_ip(node)}:{RAFT_PORT}"

    def set_aside_data(self, node: int, why: str) -> Path | None:
        if self.node_alive(node):
            raise RuntimeError(f"n{node} is running: stop it before moving its data aside")
        source = self.data_dir(node)
        if not source.exists():
            return None
        self._set_aside += 1
        target = self.out / why / self.spec.group / f"n{node}-{self._set_aside}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), str(target))
        return target

    def provision(self, node: int) -> None:
        if self.node_alive(node):
            raise RuntimeError(f"n{node} is running: it cannot be provisioned anew")
        if self.data_dir(node).exists():
            raise RuntimeError(f"n{node} still has a data directory: set it aside first")
        # A new machine is not a bootstrap member of the group it joins (else
        # its empty log's bootstrap configuration would make it a voter).
        self._write_config(node, [n for n in self.spec.original_ids if n != node]
                           or [n for n in self.all_node_ids if n != node])

    def run_on(self, node: int, argv: list[str], timeout: float = 30.0) -> tuple[int, str]:
        result = subprocess.run(["ip", "netns", "exec", self.ns, *argv], capture_output=True,
                                text=True, timeout=timeout)
        return result.returncode, result.stdout + result.stderr

    # ------------------------------------------------------------ addresses

    @property
    def namesrv_address(self) -> str:
        return NAMESRV

    def client_address(self, node: int) -> str:
        return f"{node_ip(node)}:{CLIENT_PORT}"

    def client_thread_init(self) -> Callable[[], None]:
        return lambda: enter_namespace(self.ns)

    # ------------------------------------------------------------ network

    def drop(self, src: int, dst: int, probability: float = 1.0) -> None:
        rule = ["-A", self.chain, "-s", node_ip(src), "-d", node_ip(dst)]
        if probability < 1.0:
            self.require("loss")
            rule += ["-m", "statistic", "--mode", "random", "--probability", f"{probability:.4f}"]
        self._sh("iptables", "-w", *rule, "-j", "DROP")

    def heal(self) -> None:
        self._sh("iptables", "-w", "-F", self.chain)
        if self._proxy is not None and self._proxy_loop is not None:
            self._proxy_loop.call_soon_threadsafe(self._proxy.clear)

    def rules(self) -> str:
        """Our chain's rules (for tests and the log)."""
        return self._sh("iptables", "-w", "-S", self.chain).stdout

    def shape(self, src: int, dst: int, delay_ms: float, jitter_ms: float = 0.0,
              rate_bytes_s: float = 0.0) -> None:
        self.require("delay")
        assert self._proxy is not None and self._proxy_loop is not None
        listen = (node_ip(src), PROXY_PORT_BASE + dst)
        shape = Shape(delay_ms, jitter_ms, rate_bytes_s)
        self._proxy_loop.call_soon_threadsafe(self._proxy.set_shape, listen, shape)

    def _start_proxy(self) -> None:
        links = [Link((node_ip(a), PROXY_PORT_BASE + b), (node_ip(b), RAFT_PORT), node_ip(a))
                 for a in self.all_node_ids for b in self.all_node_ids if a != b]
        self._proxy = LinkProxy(links, seed=self.seed)
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                enter_namespace(self.ns)
                loop = asyncio.new_event_loop()
                self._proxy_loop = loop
                assert self._proxy is not None
                loop.run_until_complete(self._proxy.start())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._proxy.close())
            loop.close()

        self._proxy_thread = threading.Thread(target=run, name="chaos-proxy", daemon=True)
        self._proxy_thread.start()
        started.wait(30)
        if failure:
            raise RuntimeError(f"link proxy failed to start: {failure[0]!r}")

    def _stop_proxy(self) -> None:
        if self._proxy_loop is not None and self._proxy_thread is not None:
            with contextlib.suppress(RuntimeError):
                self._proxy_loop.call_soon_threadsafe(self._proxy_loop.stop)
            self._proxy_thread.join(10)
        self._proxy_loop = None
        self._proxy_thread = None

    # ------------------------------------------------------------ clock

    def set_clock_offset(self, node: int, seconds: float) -> None:
        if self._faketime is None or not self.spec.faketime:
            self.require("clock")
        tmp = self._clock_file(node).with_suffix(".tmp")
        tmp.write_text(f"{seconds:+.3f}\n")
        os.replace(tmp, self._clock_file(node))

    # ------------------------------------------------------------ evidence

    def collect(self) -> dict[str, str]:
        """Logs and data already live under `out` (nodes write there directly)."""
        found = {"logs": str(self.out / "logs")}
        for node in self.node_ids:
            found[f"n{node}"] = str(self.data_dir(node))
        for why in ("removed", "wiped", "damaged"):
            if (self.out / why).is_dir():
                found[why] = str(self.out / why)
        return found
