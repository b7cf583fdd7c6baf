"""The docker backend: a NameServer and a broker group as containers of one compose project.

Every run gets a compose project of its own (a unique project name, its own
/24 network with fixed addresses: NameServer .2, node N .(10+N)), generated
from the run's ClusterSpec as `compose.json` in the run directory and run
from the LedgerMQ image (`docker/build-image.sh`; LEDGERMQ_IMAGE overrides the
tag). The clients run on the docker host and reach the containers by their
addresses on the bridge, so `client_thread_init` has nothing to enter.

Faults, mapped onto the containers:
- kill and pause: `docker kill -s KILL|STOP|CONT` (the entry point execs the
  broker, so the container's PID 1 is the broker itself); restart is
  `docker start` of the same container, on the same named volume.
- links: DROP rules in a chain of our own (`LMQ-CHAOS`) hooked into INPUT
  *inside* the destination container (the containers get NET_ADMIN); loss is
  the same rule with `-m statistic --mode random`. A container that is
  restarted gets a fresh network namespace, so its chain and rules are put
  back after every start.
- delay, jitter, bandwidth: `tc` netem inside the source container, one prio
  band per destination. Probed at start: on a kernel without netem the run
  refuses delay loudly (CannotInject) instead of pretending.
- power loss and file faults: on the node's named volume through its
  mountpoint on the docker host (needs a local daemon, as every backend
  operation here does); LEDGERMQ_DURABILITY_TRACE=1 is set in the containers.
- clock: refused; the image carries no libfaketime.

Security: the containers listen on every interface, so an open run says so
(`allow_open`, LEDGERMQ_ALLOW_OPEN for the NameServer); a secured run
(`spec.secure`) makes the run's secrets and a certificate for the NameServer's
and every node's address on the project's network (chaos.security), owned by
the image's user, and mounts them read-only at /etc/ledgermq/security.

Readiness: a container is up when it is running and the process in it
answers PING on its address (chaos.readiness), never from a line of its log
(a crash's traceback can contain the "listening on" source line). When it is
not, the answer carries the container's exit code and its last log lines.

Evidence: `close()` stops the nodes (SIGTERM, so they flush), copies each data
directory out with `docker cp` to `data/<group>/n<N>/` (the layout
`ledgermq audit` reads) and each container's log to `logs/`, then removes the
project's containers, network and volumes (`docker-compose down -v`). It runs
from atexit too, so an interrupted run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from chaos import readiness
from chaos.backend import Backend, CannotInject, ClusterSpec
from chaos.readiness import Readiness
from chaos.security import generate

IMAGE = os.environ.get("LEDGERMQ_IMAGE", "ledgermq:latest")
# The image runs with authentication on unless told otherwise; an open run's
# throwaway cluster lives on a private bridge network of its own, so it runs
# open on purpose (secured runs bring their own secrets, chaos/security.py).
OPEN = {"LEDGERMQ_ALLOW_OPEN": "true"}
CLIENT_PORT = 10911
RAFT_PORT = 20911
NAMESRV_PORT = 9876
CHAIN = "LMQ-CHAOS"
CONTAINER_DATA = "/var/lib/ledgermq/data"
# Secured runs: the run's `security/` directory, bind-mounted read-only, and
# the image's unprivileged user (docker/Dockerfile), which must own the
# secret files (0600) to read them.
CONTAINER_SECURITY = "/etc/ledgermq/security"
CONTAINER_UID = 10001


def docker_available() -> str | None:
    """None if docker and docker-compose work here, else why not."""
    for tool in ("docker", "docker-compose"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "the docker daemon does not answer"
    if info.returncode != 0:
        return f"the docker daemon is not reachable: {info.stderr.strip()[:200]}"
    return None


def image_present(image: str = IMAGE) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True,
                          timeout=30).returncode == 0


def used_subnets() -> list[ipaddress.IPv4Network]:
    """IPv4 subnets of every docker network on this host (to pick a free one)."""
    names = subprocess.run(["docker", "network", "ls", "-q"], capture_output=True, text=True,
                           timeout=30).stdout.split()
    if not names:
        return []
    out = subprocess.run(["docker", "network", "inspect", "-f",
                          "{{range .IPAM.Config}}{{.Subnet}} {{end}}", *names],
                         capture_output=True, text=True, timeout=30).stdout
    nets = []
    for word in out.split():
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(word, strict=False)
            if isinstance(net, ipaddress.IPv4Network):
                nets.append(net)
    return nets


def free_prefix(rng: random.Random) -> str:
    """'A.B.C' of a /24 in 172.30.0.0/15 that no docker network overlaps."""
    used = used_subnets()
    candidates = [f"172.{30 + i // 256}.{i % 256}" for i in range(512)]
    rng.shuffle(candidates)
    for prefix in candidates:
        net = ipaddress.ip_network(f"{prefix}.0/24")
        if not any(net.overlaps(u) for u in used):
            return prefix
    raise RuntimeError("no free /24 in 172.30.0.0/15 for the chaos network")


class DockerBackend(Backend):
    """One compose project per run; see the module docstring for the fault mapping."""

    def __init__(self, spec: ClusterSpec, out: str | Path, *, log: Callable[[str], None] = print,
                 seed: int = 0, image: str | None = None) -> None:
        run = self.run_number()
        self.spec = spec
        self.out = Path(out)
        self.log = log
        self.seed = seed
        self.image = image or IMAGE
        self.project = f"lmqchaos{os.getpid()}n{run}"
        self.prefix = ""
        self.compose_file = self.out / "compose.json"
        self._ids: dict[str, str] = {}
        self._rules: dict[int, list[list[str]]] = {}
        self._shapes: dict[int, dict[int, tuple[float, float, float]]] = {}
        self._caps: dict[str, str | None] = {}
        self._collected: dict[str, str] | None = None
        self._up = False
        self._closed = False

    # ------------------------------------------------------------ commands

    def _run(self, argv: list[str], *, check: bool = True,
             timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): "
                               f"{(result.stderr or result.stdout).strip()[-800:]}")
        return result

    def _compose(self, *args: str, check: bool = True,
                 timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        return self._run(["docker-compose", "-p", self.project, "-f", str(self.compose_file),
                          *args], check=check, timeout=timeout)

    def _exec(self, node: int, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A command as root inside node's container (NET_ADMIN for iptables/tc)."""
        return self._run(["docker", "exec", "-u", "0", self._ids[f"n{node}"], *argv],
                         check=check, timeout=30)

    # ------------------------------------------------------------ addresses

    def node_ip(self, node: int) -> str:
        return f"{self.prefix}.{10 + node}"

    @property
    def namesrv_address(self) -> str:
        return f"{self.prefix}.2:{NAMESRV_PORT}"

    def client_address(self, node: int) -> str:
        return f"{self.node_ip(node)}:{CLIENT_PORT}"

    def client_thread_init(self) -> Callable[[], None]:
        # The docker host routes to the bridge network directly.
        return lambda: None

    # ------------------------------------------------------------ lifecycle

    def compose_document(self) -> dict[str, object]:
        """The compose project for this run's spec (written as JSON, which is YAML)."""
        s = self.spec
        peers = ",".join(f"{n}={self.node_ip(n)}" for n in self.node_ids)
        mounts: list[str] = []
        namesrv_env = {"LEDGERMQ_BROKER_EXPIRY_MS": "5000", "LEDGERMQ_LOG_LEVEL": "WARNING"}
        namesrv_args: list[str] = []
        secured: dict[str, object] = {}
        if self.security is not None:
            mounts = [f"{self.security.directory}:{CONTAINER_SECURITY}:ro"]
            namesrv_args = self.security.namesrv_args(CONTAINER_SECURITY)
            secured = dict(self.security.broker_settings(CONTAINER_SECURITY))
        else:
            # Open on purpose: the containers listen on every interface.
            namesrv_env.update(OPEN)
            secured = {"allow_open": True}
        services: dict[str, object] = {
            "namesrv": {
                "image": self.image, "command": ["namesrv", *namesrv_args], "restart": "no",
                "environment": namesrv_env,
                "healthcheck": {"disable": True},
                "networks": {"chaos": {"ipv4_address": f"{self.prefix}.2"}},
                **({"volumes": mounts} if mounts else {}),
            }
        }
        for node in self.node_ids:
            env = {
                "LEDGERMQ_GROUP": s.group, "LEDGERMQ_NODE_ID": str(node),
                "LEDGERMQ_PEERS": peers, "LEDGERMQ_NAMESRV": self.namesrv_address,
                "LEDGERMQ_FLUSH": s.flush, "LEDGERMQ_REPLICATE": s.replicate,
                "LEDGERMQ_LOG_LEVEL": s.log_level,
                "LEDGERMQ_RAFT_TICK_MS": str(s.tick_ms),
                "LEDGERMQ_RAFT_ELECTION_TIMEOUT_TICKS": str(s.election_timeout_ticks),
                "LEDGERMQ_RAFT_HEARTBEAT_INTERVAL_TICKS": str(s.heartbeat_interval_ticks),
                "LEDGERMQ_CONF_SEGMENT_SIZE_BYTES": str(s.segment_size_bytes),
                "LEDGERMQ_CONF_NAMESRV_REGISTER_INTERVAL_MS": "500",
                "LEDGERMQ_CONF_MEMBER_EXPIRY_MS": "3000",
                # An open run must also keep the entry point from generating
                # a secret of its own (the image starts secured by default).
                **(OPEN if self.security is None else {}),
            }
            env.update({f"LEDGERMQ_CONF_{k.upper()}": str(v).lower() if isinstance(v, bool)
                        else str(v) for k, v in {**secured, **s.extra}.items()})
            if s.durability_trace:
                env["LEDGERMQ_DURABILITY_TRACE"] = "1"
            services[f"n{node}"] = {
                "image": self.image, "command": ["broker"],
                # The harness decides when a node comes back, not docker.
                "restart": "no", "cap_add": ["NET_ADMIN"], "environment": env,
                # One ping process per container every few seconds costs real
                # CPU on a small machine; the harness PINGs when it needs to know.
                "healthcheck": {"disable": True},
                "volumes": [f"n{node}:/var/lib/ledgermq", *mounts],
                "networks": {"chaos": {"ipv4_address": self.node_ip(node)}},
                "depends_on": ["namesrv"],
            }
        return {
            "version": "3.8",
            "services": services,
            "networks": {"chaos": {"ipam": {"config": [{"subnet": f"{self.prefix}.0/24"}]}}},
            "volumes": {f"n{node}": {} for node in self.node_ids},
        }

    def start(self) -> None:
        reason = docker_available()
        if reason:
            raise CannotInject(reason)
        if not image_present(self.image):
            raise CannotInject(f"image {self.image} not found: build it with "
                               "docker/build-image.sh (or set LEDGERMQ_IMAGE)")
        self._register()
        try:
            (self.out / "logs").mkdir(parents=True, exist_ok=True)
            rng = random.Random(f"{self.seed}-{self.project}")
            for attempt in range(3):
                self.prefix = free_prefix(rng)
                if self.spec.secure:
                    self._make_security()
                self.compose_file.write_text(json.dumps(self.compose_document(), indent=2))
                up = self._compose("up", "-d", "--no-build", check=False)
                self._up = True
                if up.returncode == 0:
                    break
                # Another project may have taken the subnet meanwhile: tear down, pick anew.
                self._compose("down", "-v", "--remove-orphans", check=False)
                if attempt == 2 or "overlap" not in (up.stderr + up.stdout).lower():
                    raise RuntimeError(f"docker-compose up failed: {up.stderr.strip()[-800:]}")
            for name in ["namesrv", *(f"n{n}" for n in self.node_ids)]:
                cid = self._compose("ps", "-q", name).stdout.strip()
                if not cid:
                    raise RuntimeError(f"no container for {name}")
                self._ids[name] = cid
            self.log(f"chaos: docker project {self.project} on {self.prefix}.0/24, "
                     f"image {self.image}")
            namesrv = self._wait("namesrv", self.namesrv_address, 60.0)
            if not namesrv.ready:
                raise RuntimeError(f"the NameServer container did not start: {namesrv.reason}\n"
                                   + "\n".join(namesrv.log_tail))
            for node in self.node_ids:
                ready = self.wait_node(node, 90.0)
                if not ready.ready:
                    raise RuntimeError(f"node {node} did not start: {ready.reason}\n"
                                       + "\n".join(ready.log_tail))
            self._probe()
        except BaseException:
            self.close()
            raise

    def _probe(self) -> None:
        caps: dict[str, str | None] = {k: None for k in ("kill", "pause")}
        node = self.node_ids[0]
        chain = self._exec(node, "iptables", "-w", "-S", CHAIN, check=False)
        caps["partition"] = None if chain.returncode == 0 else \
            f"iptables inside the containers failed: {chain.stderr.strip()}"
        probe = self._exec(node, "iptables", "-w", "-A", CHAIN, "-s", "192.0.2.1", "-m",
                           "statistic", "--mode", "random", "--probability", "0.5", "-j", "DROP",
                           check=False)
        caps["loss"] = caps["partition"] or (None if probe.returncode == 0 else
                                             "iptables statistic match unavailable: "
                                             + probe.stderr.strip())
        self._exec(node, "iptables", "-w", "-F", CHAIN, check=False)
        netem = self._exec(node, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay",
                           "1ms", check=False)
        if netem.returncode == 0:
            self._exec(node, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
            caps["delay"] = None
        else:
            caps["delay"] = ("the kernel has no netem qdisc (tc inside the containers: "
                             f"{(netem.stderr or netem.stdout).strip()}); the docker backend "
                             "does not fake delay")
        try:
            mount = self._volume_mountpoint(node)
            caps["power-loss"] = caps["file"] = None if os.access(mount, os.W_OK) else \
                f"volume mountpoint {mount} is not writable from here (run as root)"
        except RuntimeError as exc:
            caps["power-loss"] = caps["file"] = f"volume mountpoint unavailable: {exc}"
        caps["clock"] = "the image has no libfaketime; use the netns backend for clock faults"
        caps["membership"] = ("spare nodes and membership changes are implemented for the netns "
                              "backend only; use it for membership nemeses")
        self._caps = caps
        for fault, why in sorted(caps.items()):
            if why is not None:
                self.log(f"chaos: CANNOT INJECT {fault}: {why}")

    def capabilities(self) -> dict[str, str | None]:
        return dict(self._caps)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._up:
                for name, cid in self._ids.items():
                    if name != "namesrv":  # a stopped node must resume to stop cleanly
                        self._run(["docker", "kill", "-s", "CONT", cid], check=False)
                self._compose("stop", "-t", "10", check=False)
                with contextlib.suppress(Exception):
                    self._collected = self._collect()
        finally:
            if self._up:
                down = self._compose("down", "-v", "--remove-orphans", check=False)
                if down.returncode != 0:
                    self.log(f"chaos: docker-compose down failed: {down.stderr.strip()}")
                self._up = False
            self._unregister()

    # ------------------------------------------------------------ nodes

    def _logs(self, name: str) -> str:
        cid = self._ids.get(name)
        if cid is None:
            return ""
        result = self._run(["docker", "logs", cid], check=False, timeout=60)
        return result.stdout + result.stderr

    def _running(self, name: str) -> bool:
        state = self._run(["docker", "inspect", "-f", "{{.State.Running}}", self._ids[name]],
                          check=False, timeout=30)
        return state.stdout.strip() == "true"

    def _exit_status(self, name: str) -> int | None:
        """None while the container runs, else its exit code."""
        state = self._run(["docker", "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}",
                           self._ids[name]], check=False, timeout=30).stdout.split()
        if state and state[0] == "true":
            return None
        # -1: not running, and docker would not say how it ended.
        return int(state[1]) if len(state) == 2 and state[1].lstrip("-").isdigit() else -1

    def _make_security(self) -> None:
        """The run's secrets and certificate for this attempt's addresses,
        readable by the containers' user only."""
        directory = self.out / "security"
        shutil.rmtree(directory, ignore_errors=True)  # an earlier attempt's subnet
        self.security = generate(directory, [f"{self.prefix}.2",
                                             *(self.node_ip(n) for n in self.node_ids)])
        self._client_security = None
        for path in [directory, *directory.iterdir()]:
            os.chown(path, CONTAINER_UID, CONTAINER_UID)

    def _wait(self, name: str, address: str, timeout: float) -> Readiness:
        """Until container `name` runs and answers PING at `address` (or stops)."""
        security = self.client_security
        if name == "namesrv":
            security = security.anonymous()  # its client port knows only the cluster key
        return readiness.wait_ready(
            name, exit_status=lambda: self._exit_status(name),
            answers=lambda: readiness.ping(address, 2.0, None, security),
            tail=lambda: tuple(self._logs(name).splitlines()[-readiness.TAIL_LINES:]),
            timeout=timeout, interval=0.25)

    def start_node(self, node: int) -> None:
        self._run(["docker", "start", self._ids[f"n{node}"]])

    def wait_node(self, node: int, timeout: float) -> Readiness:
        ready = self._wait(f"n{node}", self.client_address(node), timeout)
        if ready.ready:
            # A restarted container has a new network namespace: put our chain
            # and this node's rules back, so a partition outlives a kill of its victim.
            self._install_chain(node)
        return ready

    def signal_node(self, node: int, sig: int) -> None:
        name = signal.Signals(sig).name.removeprefix("SIG")
        if self._running(f"n{node}"):
            self._run(["docker", "kill", "-s", name, self._ids[f"n{node}"]], check=False)

    def node_alive(self, node: int) -> bool:
        return self._running(f"n{node}")

    def wait_node_exit(self, node: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._running(f"n{node}"):
                return True
            time.sleep(0.1)
        return False

    def _volume_mountpoint(self, node: int) -> str:
        return self._run(["docker", "volume", "inspect", "-f", "{{.Mountpoint}}",
                          f"{self.project}_n{node}"], timeout=30).stdout.strip()

    def data_dir(self, node: int) -> Path:
        """While the project runs: the data directory on the node's volume, on this host."""
        if self._up:
            return Path(self._volume_mountpoint(node)) / Path(CONTAINER_DATA).name
        return self.out / "data" / self.spec.group / f"n{node}"

    def run_on(self, node: int, argv: list[str], timeout: float = 30.0) -> tuple[int, str]:
        result = self._run(["docker", "exec", self._ids[f"n{node}"], *argv], check=False,
                           timeout=timeout)
        return result.returncode, result.stdout + result.stderr

    # ------------------------------------------------------------ network

    def _install_chain(self, node: int) -> None:
        have = self._exec(node, "iptables", "-w", "-S", CHAIN, check=False)
        if have.returncode != 0:
            self._exec(node, "iptables", "-w", "-N", CHAIN)
            self._exec(node, "iptables", "-w", "-I", "INPUT", "-j", CHAIN)
        self._exec(node, "iptables", "-w", "-F", CHAIN)
        for rule in self._rules.get(node, []):
            self._exec(node, "iptables", "-w", "-A", CHAIN, *rule)
        if self._shapes.get(node):
            self._apply_shapes(node)

    def drop(self, src: int, dst: int, probability: float = 1.0) -> None:
        """Drop what `dst` receives from `src`, in dst's container."""
        self.require("partition")
        rule = ["-s", self.node_ip(src)]
        if probability < 1.0:
            self.require("loss")
            rule += ["-m", "statistic", "--mode", "random", "--probability", f"{probability:.4f}"]
        rule += ["-j", "DROP"]
        self._rules.setdefault(dst, []).append(rule)
        if self._running(f"n{dst}"):
            self._exec(dst, "iptables", "-w", "-A", CHAIN, *rule)

    def heal(self) -> None:
        self._rules.clear()
        shaped = [n for n, shapes in self._shapes.items() if shapes]
        self._shapes.clear()
        for node in self.node_ids:
            if self._running(f"n{node}"):
                self._exec(node, "iptables", "-w", "-F", CHAIN, check=False)
                if node in shaped:
                    self._exec(node, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)

    def rules(self, node: int) -> str:
        """The chain's rules inside node's container (for tests and the log)."""
        return self._exec(node, "iptables", "-w", "-S", CHAIN).stdout

    def shape(self, src: int, dst: int, delay_ms: float, jitter_ms: float = 0.0,
              rate_bytes_s: float = 0.0) -> None:
        """netem on src's egress towards dst (only where the kernel has netem)."""
        self.require("delay")
        self._shapes.setdefault(src, {})[dst] = (delay_ms, jitter_ms, rate_bytes_s)
        if self._running(f"n{src}"):
            self._apply_shapes(src)

    def _apply_shapes(self, src: int) -> None:
        # A prio root with one extra band per destination node; the default
        # priomap keeps every other flow in bands 1-3, unshaped.
        self._exec(src, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        bands = 3 + len(self.node_ids)
        self._exec(src, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "prio",
                   "bands", str(bands))
        for dst, (delay, jitter, rate) in sorted(self._shapes[src].items()):
            band = 3 + dst
            netem = ["delay", f"{delay:.1f}ms"]
            if jitter > 0:
                netem.append(f"{jitter:.1f}ms")
            if rate > 0:
                netem += ["rate", f"{int(rate * 8)}bit"]
            self._exec(src, "tc", "qdisc", "add", "dev", "eth0", "parent", f"1:{band}",
                       "handle", f"{band}0:", "netem", *netem)
            self._exec(src, "tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol",
                       "ip", "prio", "1", "u32", "match", "ip", "dst",
                       f"{self.node_ip(dst)}/32", "flowid", f"1:{band}")

    # ------------------------------------------------------------ clock

    def set_clock_offset(self, node: int, seconds: float) -> None:
        self.require("clock")

    # ------------------------------------------------------------ evidence

    def _collect(self) -> dict[str, str]:
        found: dict[str, str] = {}
        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for name in self._ids:
            (logs / f"{name}.log").write_text(self._logs(name))
        found["logs"] = str(logs)
        for node in self.node_ids:
            dest = self.out / "data" / self.spec.group / f"n{node}"
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            self._run(["docker", "cp", f"{self._ids[f'n{node}']}:{CONTAINER_DATA}", str(dest)],
                      timeout=300)
            found[f"n{node}"] = str(dest)
        return found

    def collect(self) -> dict[str, str]:
        """Logs and data directories under `out` (copied out at close; now if still up)."""
        if self._collected is None and self._up:
            self._collected = self._collect()
        return dict(self._collected or {})


def container_ids(project: str) -> list[str]:
    """Every container of a compose project, running or not (tests check teardown)."""
    out = subprocess.run(["docker", "ps", "-aq", "--filter",
                          f"label=com.docker.compose.project={project}"],
                         capture_output=True, text=True, timeout=30).stdout
    return out.split()

