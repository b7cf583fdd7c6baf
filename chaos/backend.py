"""The cluster backend interface: one set of operations, whatever runs the nodes.

A backend starts a NameServer and a broker group, and lets nemeses act on the
nodes: stop/start, signals (kill -9, SIGSTOP/SIGCONT), cutting and healing
directed links, packet loss, link shaping, per-node clock offsets, and the
node's data directory for file faults. `netns` runs processes in a private
network namespace; a docker backend maps the same operations onto the
containers of a compose deployment (`docker kill -s`, iptables inside the
containers with NET_ADMIN, faketime env vars, the same durability trace on a
bind-mounted data directory).

Every backend reports what it can inject (`capabilities`): a nemesis whose
fault cannot be injected here is refused loudly before the run starts, never
silently turned into a no-op.

A spec with `secure=True` runs the cluster with authentication and TLS on
every port: the backend makes the run's secrets and a throwaway CA at start
(`chaos.security`) and `client_security` is what the harness's clients
present.

Membership changes (`chaos.membership`): a spec with `spares=K` knows K more
nodes (ids `nodes+1 .. nodes+K`) whose addresses are in every node's
`[peers]` but not in `initial_members`, so a spare never campaigns and waits
to be added; spares are started on demand (`start_node`, like any node) and
`admin=True` gives the NameServer and every node an admin app, through which
the changes are made. The backend keeps the harness's view of the group:
`node_ids` is the current members (what every other nemesis targets, what
the final checks expect up and caught up), `removed` the nodes taken out of
the group (stopped, their data set aside, never expected back). Data
directories are never deleted: a wiped one is moved under `wiped/`, a
removed node's under `removed/`, both in the run directory, so the audit of
`data/` compares only the final members while nothing is lost for inspection.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import itertools
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.readiness import Readiness
from chaos.security import OPEN, ClientSecurity, SecurityFiles

# Fault kinds a nemesis may need; the backend says which it can inject.
FAULTS = ("partition", "loss", "delay", "kill", "pause", "power-loss", "file", "clock",
          "membership")


@dataclass(frozen=True)
class ClusterSpec:
    """What to run: node count, durability settings and Raft timing."""

    nodes: int = 3
    group: str = "chaos"
    flush: str = "sync"
    replicate: str = "sync"
    # Raft timing: 50 ms ticks, elections after ~1 s; slow enough for two
    # shared cores under load, fast enough that failover fits a short run.
    tick_ms: int = 50
    election_timeout_ticks: int = 20
    heartbeat_interval_ticks: int = 2
    segment_size_bytes: int = 4 << 20
    durability_trace: bool = True
    proxied: bool = False
    faketime: bool = False
    log_level: str = "INFO"
    extra: dict[str, Any] = field(default_factory=dict)
    # Authentication and TLS on every port (chaos.security): the backend makes
    # the run's secrets and certificates at start and configures every server.
    secure: bool = False
    # Membership changes (chaos.membership): this many spare nodes known to
    # everyone but not bootstrap members, and admin apps on every server.
    spares: int = 0
    admin: bool = False

    def __post_init__(self) -> None:
        if self.spares < 0:
            raise ValueError("spares must be >= 0")

    @property
    def original_ids(self) -> list[int]:
        """The bootstrap members (`initial_members`)."""
        return list(range(1, self.nodes + 1))

    @property
    def all_ids(self) -> list[int]:
        """Every node the run knows: the bootstrap members, then the spares."""
        return list(range(1, self.nodes + self.spares + 1))


class CannotInject(RuntimeError):
    """A fault this backend cannot inject on this machine."""


class HarnessError(RuntimeError):
    """The harness itself cannot go on truthfully (e.g. a torn durability trace).

    Not a finding about the system under test: the run stops with this error
    and is not valid, rather than carrying on with a fault it did not inject
    as described.
    """


# Backends with something to tear down, closed at interpreter exit so an
# interrupted run leaves no namespace, chain, process or container behind.
_live: set[Backend] = set()
_runs = itertools.count(1)


def _close_all_at_exit() -> None:
    for backend in list(_live):
        with contextlib.suppress(Exception):
            backend.close()


atexit.register(_close_all_at_exit)


class Backend(abc.ABC):
    """A running cluster the harness can break. Use as a context manager."""

    spec: ClusterSpec
    out: Path
    # Set by `start` in a secured run (spec.secure): the run's secret and TLS files.
    security: SecurityFiles | None = None
    _client_security: ClientSecurity | None = None

    @property
    def client_security(self) -> ClientSecurity:
        """What the harness's clients present to this cluster (OPEN unless secured)."""
        if self.security is None:
            return OPEN
        if self._client_security is None:
            self._client_security = self.security.client()
        return self._client_security

    @staticmethod
    def run_number() -> int:
        """1, 2, ... per process: keeps names of concurrent runs apart."""
        return next(_runs)

    def _register(self) -> None:
        """Close this backend at exit unless it is closed before."""
        _live.add(self)

    def _unregister(self) -> None:
        _live.discard(self)

    # The harness's view of the group (see the module docstring): None until a
    # membership change, then the members as the group last reported them.
    _members: tuple[int, ...] | None = None
    _removed: tuple[int, ...] = ()

    @property
    def node_ids(self) -> list[int]:
        """The group's current members (the bootstrap members until a change)."""
        if self._members is not None:
            return list(self._members)
        return self.spec.original_ids

    @property
    def all_node_ids(self) -> list[int]:
        """Every node of the run, spares included."""
        return self.spec.all_ids

    @property
    def removed(self) -> list[int]:
        """Nodes taken out of the group (stopped; not expected back)."""
        return list(self._removed)

    def set_members(self, members: list[int] | set[int] | frozenset[int]) -> None:
        """The group's members as it reported them after a change."""
        unknown = set(members) - set(self.all_node_ids)
        if unknown:
            raise ValueError(f"nodes {sorted(unknown)} are not nodes of this run")
        self._members = tuple(sorted(members))
        self._removed = tuple(n for n in self._removed if n not in self._members)

    def mark_removed(self, node: int) -> None:
        """`node` left the group: not a member, not expected up at the end."""
        if self._members is not None and node in self._members:
            self._members = tuple(n for n in self._members if n != node)
        elif self._members is None:
            self._members = tuple(n for n in self.spec.original_ids if n != node)
        if node not in self._removed:
            self._removed = (*self._removed, node)

    # membership support ------------------------------------------------------
    def admin_url(self, node: int) -> str:
        """The node's admin app (spec.admin): where membership changes are asked."""
        raise CannotInject("membership changes: this backend has no admin apps for nodes")

    @property
    def namesrv_admin_url(self) -> str:
        raise CannotInject("membership changes: this backend has no NameServer admin app")

    def raft_address(self, node: int) -> str:
        """Where the other members reach `node`'s Raft transport (`member add --address`)."""
        raise CannotInject("membership changes: this backend cannot name Raft addresses")

    def set_aside_data(self, node: int, why: str) -> Path | None:
        """Move the (stopped) node's data directory out of `data/` into `<why>/`
        of the run directory, so the node starts with an empty one; returns
        where it went (None: it had none). Never deletes anything."""
        raise CannotInject("membership changes: this backend cannot set data directories aside")

    def provision(self, node: int) -> None:
        """Make `node` ready to join as a new machine: a configuration in which it
        is not a bootstrap member (so it waits to be added), no data directory."""
        raise CannotInject("membership changes: this backend cannot provision nodes")

    def stop_node(self, node: int, timeout: float = 15.0) -> bool:
        """Stop the node gracefully (SIGTERM, then SIGKILL); True once it exited."""
        if not self.node_alive(node):
            return True
        self.signal_node(node, signal.SIGCONT)  # a paused node cannot act on SIGTERM
        self.signal_node(node, signal.SIGTERM)
        if self.wait_node_exit(node, timeout):
            return True
        self.signal_node(node, signal.SIGKILL)
        return self.wait_node_exit(node, 10.0)

    # lifecycle ---------------------------------------------------------------
    @abc.abstractmethod
    def start(self) -> None:
        """Create the environment, start the NameServer and every node."""

    @abc.abstractmethod
    def close(self) -> None:
        """Tear down everything this backend created (idempotent; safe after errors)."""

    def __enter__(self) -> Backend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abc.abstractmethod
    def capabilities(self) -> dict[str, str | None]:
        """Per fault kind: None if it can be injected, else why not."""

    def require(self, fault: str) -> None:
        reason = self.capabilities().get(fault, "unknown fault kind")
        if reason is not None:
            raise CannotInject(f"cannot inject {fault}: {reason}")

    # addresses ---------------------------------------------------------------
    @property
    @abc.abstractmethod
    def namesrv_address(self) -> str: ...

    @abc.abstractmethod
    def client_address(self, node: int) -> str: ...

    @abc.abstractmethod
    def client_thread_init(self) -> Callable[[], None]:
        """Called first in the thread that runs the clients (e.g. enter the namespace)."""

    # nodes -------------------------------------------------------------------
    @abc.abstractmethod
    def start_node(self, node: int) -> None: ...

    @abc.abstractmethod
    def wait_node(self, node: int, timeout: float) -> Readiness:
        """Wait until the node's process is alive and answers PING; says why if not
        (exit status, last log lines). Never judged from log text alone."""

    def wait_node_ready(self, node: int, timeout: float) -> bool:
        return self.wait_node(node, timeout).ready

    @abc.abstractmethod
    def signal_node(self, node: int, sig: int) -> None: ...

    @abc.abstractmethod
    def node_alive(self, node: int) -> bool: ...

    @abc.abstractmethod
    def wait_node_exit(self, node: int, timeout: float) -> bool: ...

    @abc.abstractmethod
    def data_dir(self, node: int) -> Path: ...

    @abc.abstractmethod
    def run_on(self, node: int, argv: list[str], timeout: float = 30.0) -> tuple[int, str]:
        """Run a command where the node runs; (exit status, output)."""

    # network -----------------------------------------------------------------
    @abc.abstractmethod
    def drop(self, src: int, dst: int, probability: float = 1.0) -> None:
        """Drop packets from `src` to `dst` (all of them, or at random with `probability`)."""

    @abc.abstractmethod
    def heal(self) -> None:
        """Remove every drop rule and shaping this backend added."""

    @abc.abstractmethod
    def shape(self, src: int, dst: int, delay_ms: float, jitter_ms: float = 0.0,
              rate_bytes_s: float = 0.0) -> None:
        """Delay/jitter/bandwidth on the directed link src -> dst."""

    # clock -------------------------------------------------------------------
    @abc.abstractmethod
    def set_clock_offset(self, node: int, seconds: float) -> None:
        """Shift the node's wall clock (monotonic time untouched)."""

    # evidence ----------------------------------------------------------------
    @abc.abstractmethod
    def collect(self) -> dict[str, str]:
        """Make logs and data directories available under `out`; what was collected."""
