"""One seeded simulation run: a fault phase with client writes, then a healed liveness phase.

`run_seed(seed)` is a pure function of its arguments: replaying a seed
replays the run event for event. A run fails on the first safety violation
(`dledger.invariants`), on a crash of the core's own invariant checks, or when
the healed cluster does not converge in time (a leader, every replica caught
up, every write decided).

Per seed the rng draws a fault profile (`dledger.testing.faults`), the flush
mode when `SimOptions.flush == "mix"` (async in `ASYNC_SHARE` of seeds), and
whether a Figure-8 scenario (`dledger.testing.scenarios`) runs. Under
flush=async a node that detects lost committed data stops for good; the
run then needs only the remaining nodes to converge, and reports the
stopped nodes (`RunResult.stopped`). If a quorum stops, the group cannot
serve by design: the run ends there, reported, not a violation.

Compaction (`SimOptions.compaction`: the share of seeds with it) is drawn
from a second rng derived from the seed, so seeds without it replay exactly
as they did before it existed. With it, nodes snapshot their state machines
and delete log prefixes at random points, followers far behind install
snapshots (a `FarBehind` scenario in `far_behind_probability` of those
seeds makes sure of one), and the final checks compare whole logs, the
snapshot-covered prefix included, and every state machine against the
final log. `RunResult` counts compactions, installs and snapshot transfers.

Membership changes (`SimOptions.membership`: the share of seeds with them,
drawn from a third rng) run plans of single-server changes during the fault
phase (`dledger.testing.membership`): add, promote, remove, replace, grow
and shrink, and wipes of a node's disk followed by its repair. Every seed
tracks identity (each node has a data-directory id; the first leader pins
the members). When the group heals, removed nodes are decommissioned and
the run converges only once every wiped node is repaired and every member
of the configuration in effect has caught up.

Leader-connection notices (`SimOptions.connection_loss`: the share of seeds
with them, drawn from a fourth rng, `dledger.testing.connloss`): followers of
a crashed node are told, after a grace, that its connections closed (in a
share of crashes), and during the fault phase followers of a live leader
are told so wrongly, alone or all at once.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from dledger.config import Bugs
from dledger.invariants import (
    SafetyViolation,
    check_acked_exactly_once,
    check_applied_match,
    check_final_state,
    check_prefixes_identical,
)
from dledger.log import InvariantViolation
from dledger.testing.cluster import Proposal, SimCluster
from dledger.testing.compaction import INSTALL_MUTANTS
from dledger.testing.faults import CLASSIC, draw_profile, profile_named
from dledger.testing.scenarios import FarBehind, Figure8
from dledger.testing.statemachine import digest_of
from election.roles import Role

NO_BUGS = Bugs()
FLUSH_MODES = ("sync", "async", "mix")
# Share of seeds run under flush=async when SimOptions.flush == "mix".
ASYNC_SHARE = 0.3


@dataclass(frozen=True)
class SimOptions:
    """Shape of a run; units are simulated time (a tick is about 10 units)."""

    nodes: int = 3
    fault_phase_units: int = 3000
    liveness_phase_units: int = 4000
    proposal_every_units: int = 40
    nemesis_every_units: int = 250
    crash_probability: float = 0.35
    segment_size_bytes: int = 1024
    bugs: Bugs = NO_BUGS
    # Fault profile name (dledger.testing.faults.PROFILES), or None: drawn per seed.
    profile: str | None = None
    # "sync", "async" (every seed) or "mix" (async in ASYNC_SHARE of seeds).
    flush: str = "sync"
    # Chance per seed of one Figure-8 scenario during the fault phase.
    figure8_probability: float = 0.3
    # Share of seeds with compaction and snapshot install (drawn from the
    # compaction rng: 0.0 replays every seed as before compaction existed).
    compaction: float = 0.5
    # Chance per compaction seed of one FarBehind scenario (an install for sure).
    far_behind_probability: float = 0.5
    # Deliberately broken install in the simulated driver (see compaction.py).
    install_mutant: str | None = None
    # Share of seeds with membership changes and wipes (drawn from the
    # membership rng: 0.0 leaves the group as bootstrapped).
    membership: float = 0.5
    # Share of seeds with leader-connection notices (`connloss.py`, drawn
    # from its own rng: 0.0 replays every seed as before they existed).
    connection_loss: float = 0.5
    # Share of seeds whose leaders batch the entries of the followers their
    # commit does not need (RaftNode rule 8, reserves; its own rng).
    reserves: float = 0.0

    def __post_init__(self) -> None:
        if self.flush not in FLUSH_MODES:
            raise ValueError(f"flush must be one of {FLUSH_MODES}, not {self.flush!r}")
        if not 0.0 <= self.compaction <= 1.0:
            raise ValueError("compaction is a share of seeds, 0.0 to 1.0")
        if not 0.0 <= self.membership <= 1.0:
            raise ValueError("membership is a share of seeds, 0.0 to 1.0")
        if not 0.0 <= self.connection_loss <= 1.0:
            raise ValueError("connection_loss is a share of seeds, 0.0 to 1.0")
        if not 0.0 <= self.reserves <= 1.0:
            raise ValueError("reserves is a share of seeds, 0.0 to 1.0")
        if self.install_mutant is not None and self.install_mutant not in INSTALL_MUTANTS:
            raise ValueError(f"install_mutant must be one of {INSTALL_MUTANTS}")
        if self.profile is not None:
            profile_named(self.profile)  # raises on an unknown name


@dataclass
class RunResult:
    seed: int
    nodes: int
    steps: int
    elections: int
    proposals: int
    committed: int
    acked: int
    failed: int
    crashes: int
    violation: str | None
    trace: list[str] = field(default_factory=list)
    profile: str = "classic"
    flush: str = "sync"
    figure8: bool = False
    pauses: int = 0
    stale_appends: int = 0
    applied_before_fsync: int = 0
    # flush=async: nodes stopped after detecting lost committed data, and why.
    stopped: dict[int, str] = field(default_factory=dict)
    # flush=async: committed indexes whose entry was later replaced (allowed loss).
    committed_lost: int = 0
    # Snapshots: whether this seed compacted, and what happened.
    compaction: bool = False
    far_behind: bool = False
    compactions: int = 0
    installs: int = 0
    snapshots_sent: int = 0
    transfer_failures: int = 0
    snapshot_restarts: int = 0
    # flush=async: states or snapshots that differed at an index (allowed loss).
    state_divergences: int = 0
    # Membership: whether this seed changed the group, and what happened.
    membership: bool = False
    config_changes: int = 0
    membership_plans: int = 0
    membership_plans_done: int = 0
    membership_refusals: int = 0
    nodes_added: int = 0
    nodes_removed: int = 0
    wipes: int = 0
    repairs: int = 0
    # Leader-connection notices: whether this seed had them, how many were
    # delivered, taken by the core (an early election), and wrong ones.
    connection_loss: bool = False
    reserve_batch: int = 0
    leader_notices: int = 0
    leader_notices_taken: int = 0
    leader_notices_wrong: int = 0

    @property
    def ok(self) -> bool:
        return self.violation is None


def run_seed(
    seed: int,
    options: SimOptions | None = None,
    trace: Callable[[str], None] | None = None,
) -> RunResult:
    """Run one seed; never raises for a violation, it is reported in the result."""
    options = options or SimOptions()
    rng = random.Random(seed)
    profile = draw_profile(rng, options.profile)
    flush = options.flush
    if flush == "mix":
        flush = "async" if rng.random() < ASYNC_SHARE else "sync"
    figure8 = rng.random() < options.figure8_probability
    compaction_rng = random.Random(f"compaction:{seed}")
    compaction = compaction_rng.random() < options.compaction
    far_behind = compaction and compaction_rng.random() < options.far_behind_probability
    membership_rng = random.Random(f"membership:{seed}")
    membership = membership_rng.random() < options.membership
    connloss_rng = random.Random(f"connloss:{seed}")
    connection_loss = connloss_rng.random() < options.connection_loss
    reserves_rng = random.Random(f"reserves:{seed}")
    reserve_batch = reserves_rng.choice((2, 8)) if reserves_rng.random() < options.reserves \
        else 0
    reserve_bytes = reserves_rng.choice((256, 64 * 1024))
    cluster = SimCluster(
        seed, options.nodes, options.bugs, segment_size_bytes=options.segment_size_bytes,
        trace=trace, profile=profile, flush_async=flush == "async", rng=rng,
        compaction=compaction, compaction_rng=compaction_rng,
        install_mutant=options.install_mutant,
        promote_lag_max=membership_rng.choice((0, 0, 4)),
        membership=membership, membership_rng=membership_rng,
        connection_loss=connection_loss, connection_loss_rng=connloss_rng,
        reserve_batch=reserve_batch, reserve_bytes=reserve_bytes,
    )
    cluster.log(f"profile {profile.name} flush={flush} figure8={figure8}"
                + (f" compaction far_behind={far_behind}" if compaction else "")
                + (" membership" if membership else "")
                + (f" connection_loss close={cluster.connloss.close_probability}"
                   f" grace={cluster.connloss.grace_ticks}"
                   f" wrong_every={cluster.connloss.wrong_every}"
                   f" fanout={cluster.connloss.fanout}" if connection_loss else "")
                + (f" reserves batch={reserve_batch} bytes={reserve_bytes}"
                   if reserve_batch else ""))
    cluster.members.start(options.fault_phase_units)
    cluster.connloss.start(options.fault_phase_units)
    if far_behind:
        # Late enough for a log to compact, early enough to finish in the phase.
        at = compaction_rng.randint(options.fault_phase_units // 5,
                                    options.fault_phase_units * 2 // 3)
        cluster.call_at(at, FarBehind(cluster).start)
    violation: str | None = None
    try:
        _fault_phase(cluster, options, figure8)
        violation = _liveness_phase(cluster, options)
        if violation is None and not _quorum_stopped(cluster):
            violation = _final_checks(cluster)
    except (SafetyViolation, InvariantViolation) as exc:
        violation = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a crash of the core is a failure the seed must reproduce
        violation = f"crash {type(exc).__name__}: {exc}"
    if violation is not None:
        cluster.log(f"VIOLATION {violation}")
    committed = sum(1 for p in cluster.proposals if p.index and _is_committed(cluster, p))
    return RunResult(
        seed=seed,
        nodes=options.nodes,
        steps=cluster.stats.steps,
        elections=cluster.stats.elections,
        proposals=cluster.stats.proposals,
        committed=committed,
        acked=sum(1 for p in cluster.proposals if p.acked),
        failed=len(cluster.proposals) - committed,
        crashes=cluster.stats.crashes,
        violation=violation,
        trace=list(cluster.stats.trace) if violation else [],
        profile=profile.name,
        flush=flush,
        figure8=figure8,
        pauses=cluster.stats.pauses,
        stale_appends=cluster.stats.stale_appends,
        applied_before_fsync=cluster.stats.applied_before_fsync,
        stopped=dict(cluster.stopped),
        committed_lost=cluster.checker.committed_lost,
        compaction=compaction,
        far_behind=far_behind,
        compactions=cluster.snapshots.compactions,
        installs=cluster.snapshots.installs,
        snapshots_sent=cluster.snapshots.snapshots_sent,
        transfer_failures=cluster.snapshots.transfer_failures,
        snapshot_restarts=cluster.stats.snapshot_restarts,
        state_divergences=cluster.checker.state_divergences,
        membership=membership,
        config_changes=cluster.checker.config_changes,
        membership_plans=sum(cluster.members.stats.plans.values()),
        membership_plans_done=cluster.members.stats.plans_done,
        membership_refusals=sum(cluster.members.stats.refused.values()),
        nodes_added=cluster.members.stats.nodes_added,
        nodes_removed=cluster.members.stats.removed,
        wipes=cluster.stats.wipes,
        repairs=cluster.members.stats.repairs_done,
        connection_loss=connection_loss,
        reserve_batch=reserve_batch,
        leader_notices=cluster.connloss.notices,
        leader_notices_taken=cluster.connloss.taken,
        leader_notices_wrong=cluster.connloss.wrong,
    )


def _is_committed(cluster: SimCluster, proposal: Proposal) -> bool:
    entry = cluster.checker.committed.get(proposal.index)
    return entry is not None and entry.term == proposal.term


# ------------------------------------------------------------------ phases


def _fault_phase(cluster: SimCluster, options: SimOptions, figure8: bool) -> None:
    rng = cluster.rng
    # Swarm testing: each run draws its own fault intensities, so some runs
    # are calm and some churn leaders hard (where multi-term bugs hide).
    scale = rng.choice((0.4, 0.7, 1.0))
    options = replace(
        options,
        nemesis_every_units=max(20, int(options.nemesis_every_units * scale)),
        crash_probability=rng.choice((0.5, 1.0, 2.0)) * options.crash_probability,
    )
    cluster.leader_kill_probability = rng.choice((0.0, 0.0, 0.3))
    cluster.network.faults.loss = rng.choice((0.0, 0.02, 0.1))
    cluster.network.faults.duplication = rng.choice((0.0, 0.02, 0.05))
    t = 0
    counter = 0
    while True:
        t += rng.randint(1, 2 * options.proposal_every_units)
        if t >= options.fault_phase_units:
            break
        counter += 1
        # Sizes vary so entries roll over the small simulated segments.
        data = f"p{counter}:".encode() + b"x" * rng.randint(0, 300)
        cluster.call_at(t, partial(cluster.propose, data))
    t = 0
    while True:
        t += rng.randint(options.nemesis_every_units // 2, options.nemesis_every_units * 3 // 2)
        if t >= options.fault_phase_units:
            break
        cluster.call_at(t, lambda: _nemesis(cluster, options))
    if figure8:
        # Late enough for a leader and some log, early enough to finish in the phase.
        at = rng.randint(options.fault_phase_units // 10, options.fault_phase_units // 2)
        cluster.call_at(at, Figure8(cluster).start)
    cluster.run_until(options.fault_phase_units)


def _nemesis(cluster: SimCluster, options: SimOptions) -> None:
    """One random fault (or repair), logged to the trace."""
    rng = cluster.rng
    if cluster.scenario_active:
        return
    ids = cluster.node_ids
    down = [n for n in ids if cluster.nodes[n] is None and n not in cluster.stopped]
    roll = rng.random()
    if roll < options.crash_probability:
        if down and rng.random() < 0.5:
            cluster.restart(rng.choice(down))
        else:
            leaders = [n.id for n in cluster.alive() if n.role is Role.LEADER]
            victim = rng.choice(leaders) if leaders and rng.random() < 0.5 else rng.choice(ids)
            cluster.crash(victim)
        return
    pause = cluster.profile.pause_probability
    if pause and rng.random() < pause:
        alive = [n.id for n in cluster.alive()]
        leaders = [n.id for n in cluster.alive() if n.role is Role.LEADER]
        if alive:
            victim = leaders[0] if leaders and rng.random() < 0.5 else rng.choice(alive)
            cluster.pause(victim, rng.randint(*cluster.profile.pause_units), rng.random() < 0.5)
        return
    net = cluster.network
    shape = rng.randint(0, 6)
    leaders = [n.id for n in cluster.alive() if n.role is Role.LEADER]
    if shape == 0:
        net.heal()
    elif shape == 1:
        net.split(set(rng.sample(ids, rng.randint(1, len(ids) // 2))))
    elif shape == 2:
        net.split({leaders[0]} if leaders else {rng.choice(ids)})  # isolate the leader
    elif shape == 3:
        src = leaders[0] if leaders and rng.random() < 0.5 else rng.choice(ids)
        others = [n for n in ids if n != src]
        net.one_way(src, rng.sample(others, rng.randint(1, len(others))))
    elif shape == 4:
        net.bridge(rng.choice(ids))
    elif shape == 5:
        net.ring()
    else:
        net.faults.loss = rng.choice((0.0, 0.05, 0.2))
        net.faults.duplication = rng.choice((0.0, 0.05))
        cluster.log(f"network loss={net.faults.loss} dup={net.faults.duplication}")
        return
    cluster.log(f"network {net.shape}")


def _liveness_phase(cluster: SimCluster, options: SimOptions) -> str | None:
    cluster.faults_active = False
    cluster.leader_kill_probability = 0.0
    cluster.network.heal()
    cluster.network.faults.loss = 0.0
    cluster.network.faults.duplication = 0.0
    # Healed means the network's timing faults end too (wide reordering, the
    # long tail); disks keep their latency: slow hardware stays slow.
    cluster.network.faults.long_delay_probability = 0.0
    cluster.network.faults.delay_control = CLASSIC.delay_control
    cluster.network.faults.delay_replication = CLASSIC.delay_replication
    cluster.log("heal: network healed, all nodes restarted")
    cluster.members.heal()
    for n in cluster.node_ids:
        cluster.restart(n)
    # A repair copies a whole log to a wiped node before promoting it: the
    # slowest profiles (one-entry batches behind slow fsyncs) need longer.
    units = options.liveness_phase_units * (2 if cluster.members.enabled else 1)
    # A node far behind catches up one entry per round trip and fsync on the
    # slowest profiles (seed 167: ~60 entries behind slow_disk's 40-300 unit
    # fsyncs took more than 4,000 units). So the window is extended, up to
    # LIVENESS_EXTENSIONS times, while the group still makes progress (some
    # node's last or applied index moved in the window): what is judged is a
    # group that stopped converging, not one still catching up slowly.
    deadline = cluster.now + units
    extensions = 0
    seen = _progress(cluster)
    while True:
        while cluster.now < deadline:
            cluster.run_until(cluster.now + 50)
            if _quorum_stopped(cluster):
                cluster.log("a quorum stopped after detecting lost data: "
                            f"{sorted(cluster.stopped)}")
                return None
            if _converged(cluster):
                return None
        now_seen = _progress(cluster)
        if now_seen == seen or extensions >= LIVENESS_EXTENSIONS:
            break
        seen, extensions = now_seen, extensions + 1
        cluster.log(f"liveness: still catching up after {units * extensions} units: "
                    "window extended")
        deadline = cluster.now + units
    return f"liveness: no convergence {units * (extensions + 1)} units after heal: " + (
        _describe(cluster)
    )


# How many more liveness windows a group that still progresses gets.
LIVENESS_EXTENSIONS = 2


def _progress(cluster: SimCluster) -> tuple[tuple[int, int], ...]:
    """Each running node's (last index, applied index): what moves while a group
    catches up. Not the term: elections that never settle are no progress."""
    return tuple((n.log.last_index, n.applied) for n in cluster.alive())


def _quorum_stopped(cluster: SimCluster) -> bool:
    """So many voters stopped for good (lost committed data) that no quorum is
    left, in the last committed configuration or in one a live node acts on
    (an uncommitted one may be the one the group needs)."""
    if not cluster.stopped:
        return False
    last = cluster.checker.last_config
    views = [last[1] if last is not None else cluster.bootstrap]
    views += [node.membership for node in cluster.alive()]
    for view in views:
        running = sum(1 for v in view.voter_ids if v not in cluster.stopped)
        if running < len(view.voters) // 2 + 1:
            return True
    return False


def _converged(cluster: SimCluster) -> bool:
    nodes = cluster.alive()
    leaders = [n for n in nodes if n.role is Role.LEADER]
    if len(nodes) != len(cluster.running_ids()) or not leaders:
        return False
    leader = max(leaders, key=lambda n: n.term)
    # A node outside the leader's configuration may still believe it leads
    # an older term (removed before it heard so, without check-quorum): it
    # can commit nothing, and nobody it could reach answers in its term.
    if any(n is not leader and n.id in leader.membership.node_ids for n in leaders):
        return False
    if leader.log.last_term() != leader.term or leader.commit != leader.log.last_index:
        return False
    if leader.membership_pending or not cluster.members.settled():
        return False
    members = leader.membership.node_ids
    for node in nodes:
        if node.id not in members:
            continue  # joined and cut again, or removed and not told: not replicated to
        if node.term != leader.term or node.leader_id != leader.id:
            return False
        if node.commit != leader.commit or node.applied != leader.commit:
            return False
        if node.log.last_index != leader.log.last_index or cluster.syncing[node.id] is not None:
            return False
    return True


def _describe(cluster: SimCluster) -> str:
    parts = []
    for node in cluster.alive():
        parts.append(
            f"{node.id}:{node.role.name} t{node.term} lead{node.leader_id} "
            f"first{node.log.first_index()} last{node.log.last_index} commit{node.commit} "
            f"applied{node.applied}"
        )
    return "; ".join(parts)


def _final_checks(cluster: SimCluster) -> str | None:
    leaders = [node for node in cluster.alive() if node.role is Role.LEADER]
    if not leaders:
        return None  # a quorum stopped (flush=async): nothing left to compare
    leader = max(leaders, key=lambda n: n.term)
    # Whole logs: the entries a node's snapshot covers, then those it stores,
    # of every member (a node outside the configuration is no longer replicated to).
    members = leader.membership.node_ids
    logs = {n: cluster.disks[n].full_log() for n in cluster.running_ids() if n in members}
    problem = check_prefixes_identical(logs, leader.commit)
    if problem:
        return problem
    final_log = logs[leader.id]
    cluster.checker.observe_committed(final_log, leader.term)
    acked = [p.data for p in cluster.proposals if p.acked]
    problem = check_acked_exactly_once(acked, final_log, may_lose=cluster.flush_async)
    if problem:
        return problem
    for n in cluster.running_ids():
        if n not in members and cluster.flush_async:
            # Outside the configuration nobody replicates to it, so it cannot
            # learn that committed entries it applied were lost (flush=async
            # allows the loss; the runtime stops a node it finds removed).
            continue
        problem = check_applied_match(n, cluster.applied_logs[n], final_log)
        if problem:
            return problem
        machine = cluster.machines.get(n)
        if machine is not None:
            index = machine.index
            expected = digest_of(final_log[:index]) if index <= len(final_log) else None
            problem = check_final_state(n, index, machine.digest, expected)
            if problem:
                return problem
    # Every write is decided: committed at its (index, term) or gone for good.
    for p in cluster.proposals:
        if p.index and p.index <= len(final_log):
            entry = final_log[p.index - 1]
            if entry.term == p.term and entry.data != p.data:
                return f"proposal {p.data[:12]!r} at {p.index}/{p.term} holds other data"
    return None


def replay_hint(seed: int, nodes: int, flush: str = "sync", compaction: float | None = None,
                membership: float | None = None,
                connection_loss: float | None = None, reserves: float = 0.0) -> str:
    """The command that replays a seed (`compaction`, `membership`: shares other
    than the defaults)."""
    extra = ""
    if compaction is not None and compaction != SimOptions.compaction:
        extra = f" --compaction {compaction}"
    if membership is not None and membership != SimOptions.membership:
        extra += f" --membership {membership}"
    if connection_loss is not None and connection_loss != SimOptions.connection_loss:
        extra += f" --connection-loss {connection_loss}"
    if reserves:
        extra += f" --reserves {reserves}"
    return f"replay with: ledgermq sim --seed {seed} --nodes {nodes} --flush {flush}{extra} --trace"


def fresh_seeds(count: int, source: random.Random | None = None) -> list[int]:
    """Seeds for a CI run that explores new ground each time (callers print them)."""
    rng = source or random.Random()
    return [rng.randrange(1, 2**31) for _ in range(count)]
