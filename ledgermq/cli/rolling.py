"""Rolling restart of a broker group: one node at a time, leadership handed
over first, each node caught up before the next (`ledgermq cluster roll`,
docs/operations.md "Rolling restart and upgrade procedure").

For every node, in order (followers first, the leader last, unless told):

1. the group must be whole: every node answers and a leader is ready
   (restarting a node while another is down could take the majority away);
2. if the node leads, leadership goes to the most caught-up other node
   through the admin API (`POST /api/v1/leadership/transfer`), and the roll
   waits until that node leads;
3. the node is stopped by its PID (SIGTERM, SIGKILL after a grace period) and
   started again with the same command, until it prints its ready line;
4. the roll waits until the node's applied index reaches the leader's commit
   index as it was when the node came back.

A `GroupWatch` thread polls every node's status meanwhile (BROKER_STATUS
over the wire, one connection per node kept open) and measures, per step,
how long the group had no ready leader: the step's *availability gap*, the
time writes could not be accepted.

Nodes are `RollTarget`s: `cluster_targets` for a `LocalCluster` this process
runs (tests), `manifest_targets` for the cluster a `ledgermq dev` elsewhere
started (its `cluster.json`); those restarted nodes run detached and outlive
the roll. Stop and start are called on the calling thread: a LocalCluster's
children are tied to the thread that starts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.base.processes import start_detached
from ledgermq.broker.launcher import (
    LocalCluster,
    manifest_process,
    read_manifest,
    write_manifest,
)

__all__ = [
    "GroupWatch",
    "RollError",
    "RollStep",
    "RollTarget",
    "admin_transfer",
    "cluster_targets",
    "manifest_targets",
    "ready_leader",
    "roll",
    "roll_order",
]

# How often the watch polls every node: the resolution of the measured gaps.
POLL_INTERVAL_S = 0.025
_STATUS_TIMEOUT_S = 0.5
_BROKER_READY = r"broker listening on (\S+):(\d+)"


class RollError(Exception):
    """The roll stopped: the group was not whole, a transfer failed, or a node
    did not come back or catch up in time. The message says which and why."""


class RollTarget(Protocol):
    """One node to restart."""

    node_id: int
    client_address: str

    def stop(self) -> None:
        """Stop it by PID; return once it has exited."""

    def start(self, timeout: float) -> None:
        """Start it with the same command; return once it is ready."""


# (admin URL of the leader, group, node to lead) -> None, raising on failure.
Transfer = Callable[[str, str, int], None]


@dataclass
class RollStep:
    """What restarting one node took (seconds)."""

    node_id: int
    was_leader: bool = False
    transferred_to: int = 0
    transfer_s: float = 0.0
    stop_s: float = 0.0
    start_s: float = 0.0
    catch_up_s: float = 0.0
    caught_up_to: int = 0
    unavailable_s: float = 0.0  # no ready leader, summed over the step
    longest_gap_s: float = 0.0  # the longest stretch without one
    total_s: float = 0.0
    poll_interval_s: float = POLL_INTERVAL_S  # the gaps' resolution
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}

    def describe(self) -> str:
        head = f"n{self.node_id}" + (" (leader)" if self.was_leader else "")
        parts = []
        if self.transferred_to:
            parts.append(f"leadership to n{self.transferred_to} in {self.transfer_s:.2f} s")
        parts.append(f"stopped in {self.stop_s:.2f} s, ready in {self.start_s:.2f} s")
        parts.append(f"caught up to index {self.caught_up_to} in {self.catch_up_s:.2f} s")
        if self.unavailable_s:
            gap = (f"writes unavailable {self.unavailable_s:.2f} s (longest gap"
                   f" {self.longest_gap_s:.2f} s)")
        else:
            gap = (f"writes unavailable: no gap seen (every node polled every"
                   f" {self.poll_interval_s * 1000:.0f} ms)")
        return f"{head}: {'; '.join(parts)}; {gap}; step {self.total_s:.2f} s"


class GroupWatch:
    """Polls every node's status from a thread of its own and keeps the
    latest, with when it arrived, and the time without a ready leader since
    the last `mark()`. A context manager (starts and stops the thread)."""

    def __init__(self, addresses: dict[int, str], *, credentials: Any = None, tls: Any = None,
                 interval: float = POLL_INTERVAL_S) -> None:
        self.addresses = dict(addresses)
        self.credentials = credentials
        self.tls = tls
        self.interval = interval
        self._lock = threading.Lock()
        self._latest: dict[int, tuple[float, dict[str, Any] | None]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="group-watch")
        self._rounds = threading.Condition(self._lock)
        self._round = 0
        self._prev_t = 0.0
        self._gap_start: float | None = None
        self._unavailable = 0.0
        self._longest = 0.0

    def __enter__(self) -> GroupWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    # ------------------------------------------------------------- the thread

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        from ledgermq.wire import RpcClient

        clients: dict[int, RpcClient | None] = dict.fromkeys(self.addresses)

        async def poll(nid: int) -> dict[str, Any] | None:
            client = clients[nid]
            try:
                if client is None or client.closed:
                    host, port = split_host_port(self.addresses[nid])
                    client = clients[nid] = await RpcClient.connect(
                        host, port, role="admin", timeout=_STATUS_TIMEOUT_S,
                        credentials=self.credentials, ssl=self.tls)
                status: dict[str, Any] = await client.request(
                    RequestCode.BROKER_STATUS, None, timeout=_STATUS_TIMEOUT_S)
                return status
            except Exception:  # down, restarting, refusing: no answer this round
                if client is not None:
                    with contextlib.suppress(Exception):
                        await client.close()
                clients[nid] = None
                return None

        try:
            while not self._stop.is_set():
                started = time.monotonic()
                answers = await asyncio.gather(*(poll(nid) for nid in self.addresses))
                self._record(time.monotonic(), dict(zip(self.addresses, answers, strict=True)))
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
        finally:
            for client in clients.values():
                if client is not None:
                    with contextlib.suppress(Exception):
                        await client.close()

    def _record(self, now: float, answers: dict[int, dict[str, Any] | None]) -> None:
        with self._lock:
            for nid, status in answers.items():
                self._latest[nid] = (now, status)
            if ready_leader(answers):
                self._gap_start = None
            else:
                if self._gap_start is None:
                    self._gap_start = self._prev_t or now
                self._unavailable += now - (self._prev_t or now)
                self._longest = max(self._longest, now - self._gap_start)
            self._prev_t = now
            self._round += 1
            self._rounds.notify_all()

    # ------------------------------------------------------------ the readers

    def mark(self) -> None:
        """Start counting the time without a ready leader afresh."""
        with self._lock:
            self._unavailable = 0.0
            self._longest = 0.0
            if self._gap_start is not None:
                self._gap_start = self._prev_t

    def gaps(self) -> tuple[float, float]:
        """(seconds without a ready leader, the longest such stretch) since `mark`."""
        with self._lock:
            return self._unavailable, self._longest

    def statuses(self, since: float = 0.0) -> dict[int, dict[str, Any] | None]:
        """The latest status of each node received after `since` (monotonic
        time; None: no answer, or none that recent)."""
        with self._lock:
            return {nid: (status if at > since else None)
                    for nid, (at, status) in self._latest.items()}

    def wait_for(self, what: str, predicate: Callable[[dict[int, dict[str, Any] | None]], Any],
                 timeout: float, since: float = 0.0) -> Any:
        """Wait until `predicate(statuses(since))` is truthy; its value.
        RollError naming `what` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                seen = self._round
            value = predicate(self.statuses(since))
            if value:
                return value
            left = deadline - time.monotonic()
            if left <= 0:
                raise RollError(f"{what} within {timeout:g} s")
            with self._lock:
                if self._round == seen:  # nothing new yet: wait for the next round
                    self._rounds.wait(min(left, 1.0))


def ready_leader(statuses: dict[int, dict[str, Any] | None]) -> int:
    """The id of a node reporting itself a ready leader, 0 if none."""
    for nid, status in sorted(statuses.items()):
        if status and status.get("role") == "leader" and status.get("leader_ready"):
            return nid
    return 0


def roll_order(leader: int, node_ids: Sequence[int]) -> list[int]:
    """Followers first (by id), the leader last: one leadership transfer per roll."""
    return sorted(n for n in node_ids if n != leader) + ([leader] if leader in node_ids else [])


def roll(targets: Sequence[RollTarget], watch: GroupWatch, transfer: Transfer | None, *,
         start_timeout: float = 60.0, catch_up_timeout: float = 120.0,
         settle_timeout: float = 30.0,
         report: Callable[[RollStep], None] = lambda step: None) -> list[RollStep]:
    """Restart `targets` one at a time (see the module docstring); the steps.
    `transfer` None: a leader is stopped without handing over (an election
    follows). RollError stops the roll at the step that failed."""
    steps = []
    for target in targets:
        step = _restart(target, watch, transfer, start_timeout, catch_up_timeout,
                        settle_timeout)
        report(step)
        steps.append(step)
    return steps


def _restart(target: RollTarget, watch: GroupWatch, transfer: Transfer | None,
             start_timeout: float, catch_up_timeout: float, settle_timeout: float) -> RollStep:
    nid = target.node_id
    step = RollStep(nid, poll_interval_s=watch.interval)
    began = time.monotonic()

    def whole(statuses: dict[int, dict[str, Any] | None]) -> int:
        return ready_leader(statuses) if all(statuses.values()) else 0

    try:
        leader = watch.wait_for("the group to be whole (every node answering, a leader ready)",
                                whole, settle_timeout, since=time.monotonic())
    except RollError as exc:
        down = sorted(n for n, s in watch.statuses().items() if s is None)
        raise RollError(f"before restarting n{nid}: waited for {exc}; "
                        + (f"not answering: {', '.join(f'n{n}' for n in down)}"
                           if down else "no ready leader")
                        + " (restarting a node now could leave the group without a majority;"
                        " bring the group back first)") from None
    watch.mark()
    if leader == nid:
        step.was_leader = True
        _hand_over(step, watch, transfer, settle_timeout)
    t = time.monotonic()
    target.stop()
    step.stop_s = time.monotonic() - t
    t = time.monotonic()
    try:
        target.start(start_timeout)
    except RuntimeError as exc:
        raise RollError(f"n{nid} did not start again: {' '.join(str(exc).split())}") from None
    ready = time.monotonic()
    step.start_s = ready - t
    # The leader's commit index once the node is back: what it must reach.
    now_leader = watch.wait_for("a ready leader after the restart", ready_leader,
                                settle_timeout, since=ready)
    commit = int((watch.statuses(ready)[now_leader] or {}).get("commit_index", 0))
    step.caught_up_to = commit

    def caught_up(statuses: dict[int, dict[str, Any] | None]) -> bool:
        status = statuses.get(nid) or {}
        return int(status.get("applied_index", -1)) >= commit

    t = time.monotonic()
    try:
        watch.wait_for(f"n{nid} to apply up to index {commit}", caught_up, catch_up_timeout,
                       since=ready)
    except RollError as exc:
        applied = (watch.statuses().get(nid) or {}).get("applied_index", "?")
        raise RollError(f"{exc} (it has applied up to {applied}); the roll stops here") from None
    step.catch_up_s = time.monotonic() - t
    step.unavailable_s, step.longest_gap_s = watch.gaps()
    step.total_s = time.monotonic() - began
    return step


def _hand_over(step: RollStep, watch: GroupWatch, transfer: Transfer | None,
               settle_timeout: float) -> None:
    """Move leadership away from `step.node_id` (the leader) before it stops."""
    nid = step.node_id
    statuses = watch.statuses()
    mine = statuses.get(nid) or {}
    admin_url = mine.get("admin_url")
    if transfer is None or not admin_url:
        step.notes.append("no admin app to hand leadership over: stopped while leading"
                          " (an election follows)")
        return
    others = {n: s for n, s in statuses.items() if n != nid and s}
    if not others:
        step.notes.append("no other node answers: stopped while leading")
        return
    # The most caught-up other node takes over (ties: the lowest id).
    to = max(others, key=lambda n: (int(others[n].get("applied_index", 0)), -n))
    t = time.monotonic()
    try:
        transfer(str(admin_url), str(mine.get("group", "")), to)
    except Exception as exc:
        raise RollError(f"handing leadership from n{nid} to n{to} failed: "
                        f"{' '.join(str(exc).split())}") from None
    watch.wait_for(f"n{to} (or another node) to lead after the transfer from n{nid}",
                   lambda s: ready_leader(s) not in (0, nid), settle_timeout,
                   since=time.monotonic())
    step.transferred_to = to
    step.transfer_s = time.monotonic() - t


def admin_transfer(credentials: Any = None, token: str = "", ca_file: str = "") -> Transfer:
    """A `Transfer` through a broker's admin API, as the given user."""
    from ledgermq.base import loop
    from ledgermq.client.admin import AdminApi

    def transfer(admin_url: str, group: str, to: int) -> None:
        async def call() -> None:
            async with AdminApi(admin_url, credentials=credentials, token=token,
                                ca_file=ca_file) as api:
                await api.call("POST", "leadership/transfer", {"group": group, "to": to})

        loop.run(call())

    return transfer


# ------------------------------------------------------------------ targets


@dataclass
class _ClusterNode:
    """A node of a LocalCluster this process runs."""

    cluster: LocalCluster
    node_id: int
    client_address: str

    def stop(self) -> None:
        self.cluster.brokers[self.node_id].stop()

    def start(self, timeout: float) -> None:
        self.cluster.start_node(self.node_id, wait=True, timeout=timeout)


def cluster_targets(cluster: LocalCluster, order: Sequence[int]) -> list[RollTarget]:
    return [_ClusterNode(cluster, nid, cluster.client_address(nid)) for nid in order]


@dataclass
class _ManifestNode:
    """A node of the cluster described by `<base>/cluster.json`, whoever
    started it: stopped by PID (its command line checked first), started
    again detached, and its new PID written back into the manifest."""

    base: Path
    node_id: int
    client_address: str

    def _entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = read_manifest(self.base)["nodes"][str(self.node_id)]
        return entry

    def stop(self) -> None:
        process = manifest_process(f"n{self.node_id}", self._entry())
        if not process.alive:
            raise RollError(f"n{self.node_id}: pid {process.pid} does not run"
                            f" {' '.join(process.argv)}; {self.base}/cluster.json is stale")
        process.stop()

    def start(self, timeout: float) -> None:
        import re

        entry = self._entry()
        running, _ = start_detached(f"n{self.node_id}", [str(a) for a in entry["argv"]],
                                    re.compile(_BROKER_READY), Path(entry["log"]), timeout)
        manifest = read_manifest(self.base)
        manifest["nodes"][str(self.node_id)]["pid"] = running.pid
        write_manifest(self.base, manifest)


def manifest_targets(base: Path, order: Sequence[int]) -> list[RollTarget]:
    nodes = read_manifest(base)["nodes"]
    return [_ManifestNode(base, nid, str(nodes[str(nid)]["client"])) for nid in order]
