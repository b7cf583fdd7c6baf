"""Compaction and snapshot transfer in the core simulator: the driver's side of snapshots.

`SnapshotSim` does for a `SimCluster` what the runtime does for a real node:

- compaction rounds: every so often each live, unpaused node may snapshot
  its state machine at a random index <= what it applied (and holds durably)
  and delete the log entries below it (`SimDisk.compact`); often right up to
  the applied index, so that a follower lagging by a few entries already
  needs a snapshot;
- transfers: an `InstallSnapshot` the core emits is the end of a transfer;
  the simulated transfer takes extra time, can fail (the leader's core then
  hears `report_snapshot(peer, False)`) and sometimes reports success;
- installs: a follower's `Ready.snapshot` is installed from the snapshot
  store (every snapshot ever taken, by (index, term)) into its disk and its
  state machine, checked against every other state seen at that index.

Every draw comes from the run's compaction rng, separate from the main one,
so a seed without compaction replays exactly as before compaction existed.
`install_mutant="stale_state"` breaks the install on purpose (the follower
installs an older state under the snapshot's index) to prove the checks bite.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dledger.entry import Entry
from dledger.invariants import SafetyChecker, SafetyViolation
from dledger.messages import InstallSnapshot
from dledger.raw_node import RaftNode
from dledger.storage import SnapshotMeta
from dledger.testing.disk import SimDisk
from dledger.testing.network import SimNetwork
from dledger.testing.statemachine import SimSnapshot, SimStateMachine
from election.roles import Role

INSTALL_MUTANTS = ("stale_state",)


class SnapshotHost(Protocol):
    """What `SnapshotSim` needs of its cluster (`dledger.testing.cluster.SimCluster`)."""

    node_ids: list[int]
    nodes: dict[int, RaftNode | None]
    machines: dict[int, SimStateMachine]
    applied_logs: dict[int, dict[int, Entry]]
    disks: dict[int, SimDisk]
    checker: SafetyChecker
    network: SimNetwork
    now: int
    faults_active: bool
    paused_until: dict[int, int]
    generation: dict[int, int]

    def log(self, text: str) -> None: ...

    def call_at(self, at: int, action: Callable[[], None]) -> None: ...

    def after_step(self, n: int) -> None: ...


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """Per-run knobs, drawn from the compaction rng."""

    every_units: int
    node_share: float
    to_applied_share: float
    transfer_units: tuple[int, int]
    transfer_failure: float
    report_success: float
    snapshot_timeout_ticks: int

    @classmethod
    def draw(cls, rng: random.Random) -> CompactionPlan:
        return cls(
            every_units=rng.choice((60, 150, 400)),
            node_share=rng.choice((0.3, 0.6, 1.0)),
            to_applied_share=rng.choice((0.3, 0.7)),
            transfer_units=rng.choice(((1, 20), (10, 120), (50, 400))),
            transfer_failure=rng.choice((0.0, 0.1, 0.3)),
            report_success=rng.choice((0.0, 0.5)),
            snapshot_timeout_ticks=rng.choice((6, 20, 60)),
        )


class SnapshotSim:
    """Compaction rounds, snapshot transfers and installs of one `SimCluster`."""

    def __init__(
        self,
        cluster: SnapshotHost,
        rng: random.Random,
        enabled: bool,
        install_mutant: str | None = None,
    ) -> None:
        if install_mutant is not None and install_mutant not in INSTALL_MUTANTS:
            raise ValueError(f"unknown install mutant {install_mutant!r}; known: {INSTALL_MUTANTS}")
        self.cluster = cluster
        self.rng = rng
        self.enabled = enabled
        self.plan = CompactionPlan.draw(rng) if enabled else None
        self.install_mutant = install_mutant
        # Every snapshot taken, by (index, term): what a transfer carries.
        self.store: dict[tuple[int, int], SimSnapshot] = {}
        self.compactions = 0
        self.installs = 0
        self.snapshots_sent = 0
        self.transfer_failures = 0

    @property
    def snapshot_timeout_ticks(self) -> int:
        return self.plan.snapshot_timeout_ticks if self.plan is not None else 100

    def start(self) -> None:
        """Schedule the first compaction round (no-op unless enabled)."""
        if self.plan is not None:
            self.cluster.call_at(self.rng.randint(1, self.plan.every_units), self._round)

    # ------------------------------------------------------------ compaction

    def _round(self) -> None:
        plan = self.plan
        assert plan is not None
        cluster = self.cluster
        for n in cluster.node_ids:
            if cluster.nodes[n] is None or cluster.now < cluster.paused_until[n]:
                continue
            if self.rng.random() < plan.node_share:
                self.compact(n, to_applied=self.rng.random() < plan.to_applied_share)
        low = max(1, plan.every_units // 2)
        cluster.call_at(cluster.now + self.rng.randint(low, plan.every_units * 3 // 2),
                        self._round)

    def compact(self, n: int, to_applied: bool) -> bool:
        """Node `n` snapshots its state and deletes the log below it; False if nothing to do."""
        cluster = self.cluster
        machine = cluster.machines.get(n)
        disk = cluster.disks[n]
        if cluster.nodes[n] is None or machine is None:
            return False
        first = disk.volatile.first_index()
        # Only applied entries, and only where the log is durable (the runtime
        # never deletes past the durable end).
        limit = min(machine.index, disk.durable_last()[1], disk.volatile.last_index())
        while limit >= first and disk.durable_term(limit) is None:
            limit -= 1
        if limit < first:
            return False
        index = limit if to_applied else self.rng.randint(first, limit)
        snap = machine.snapshot(index)
        cluster.checker.observe_snapshot(index, snap.meta.term, snap.digest)
        self.store.setdefault((index, snap.meta.term), snap)
        if not disk.compact(snap):
            return False
        self.compactions += 1
        cluster.log(f"compact {n} to {index}/{snap.meta.term}")
        return True

    # -------------------------------------------------------------- transfer

    def transfer(self, n: int, msg: InstallSnapshot) -> list[int]:
        """Arrival times of an InstallSnapshot (after its data), [] if the transfer fails."""
        cluster = self.cluster
        plan = self.plan
        self.snapshots_sent += 1
        if plan is None:
            return cluster.network.arrivals(msg, cluster.now)
        delay = self.rng.randint(*plan.transfer_units)
        if cluster.faults_active and self.rng.random() < plan.transfer_failure:
            self.transfer_failures += 1
            cluster.log(f"snapshot transfer {n}->{msg.dst} of {msg.index} failed")
            self._report_later(n, msg, False, cluster.now + delay)
            return []
        times = [at + delay for at in cluster.network.arrivals(msg, cluster.now)]
        if times and self.rng.random() < plan.report_success:
            self._report_later(n, msg, True, times[0])
        return times

    def _report_later(self, n: int, msg: InstallSnapshot, ok: bool, at: int) -> None:
        cluster = self.cluster
        generation = cluster.generation[n]

        def report() -> None:
            node = cluster.nodes[n]
            if node is None or cluster.generation[n] != generation:
                return
            if cluster.now < cluster.paused_until[n]:
                cluster.call_at(cluster.paused_until[n], report)
                return
            if node.role is Role.LEADER and node.term == msg.term:
                node.report_snapshot(msg.dst, ok)
                cluster.after_step(n)

        cluster.call_at(at, report)

    # --------------------------------------------------------------- install

    def install(self, n: int, meta: SnapshotMeta) -> None:
        """Node `n`'s Ready carries `meta`: install it into its disk and state machine."""
        cluster = self.cluster
        snap = self.store.get((meta.index, meta.term))
        if snap is None:
            raise SafetyViolation(f"node {n} restored snapshot {meta} that no node ever took")
        if self.install_mutant == "stale_state":
            snap = self._stale(snap)
        cluster.disks[n].install(snap)
        cluster.machines[n] = SimStateMachine(snap)
        # The state machine was replaced, with the history of what it applied
        # (as on a restart). Under flush=sync the two agree anyway (checked
        # below); under async this is how a replica that applied a committed
        # entry the group lost gets back in step (the final checks compare its
        # state with the group's log).
        cluster.applied_logs[n] = {}
        self.installs += 1
        cluster.log(f"install {n} snapshot {meta.index}/{meta.term}")
        cluster.checker.observe_snapshot(meta.index, meta.term, snap.digest)
        cluster.checker.observe_state(n, meta.index, snap.digest)

    def _stale(self, snap: SimSnapshot) -> SimSnapshot:
        """The mutant: the state one entry short of the snapshot, under its meta."""
        entries = snap.entries[:-1]
        digest = SimStateMachine(None)
        for entry in entries:
            digest.apply(entry)
        return SimSnapshot(snap.meta, digest.digest, snap.entries)

    # ----------------------------------------------------------------- views

    def snapshot_of(self, n: int) -> SimSnapshot | None:
        """The snapshot node `n`'s log starts after (restored or on its disk)."""
        node = self.cluster.nodes[n]
        if node is not None and node.log.unstable_snapshot is not None:
            meta = node.log.unstable_snapshot
            return self.store.get((meta.index, meta.term))
        return self.cluster.disks[n].volatile_snapshot

