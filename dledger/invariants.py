"""Safety predicates of Raft over observed cluster history, used by the simulator on every step.

Each `check_*` function is pure: it takes what was observed and returns a
description of the violation, or None. `SafetyChecker` keeps the history
those predicates need (leaders per term, every (index, term) ever written,
the committed log) and raises `SafetyViolation` on the first failure.

Checked in both flush modes:
- election safety: at most one leader per term (term and vote are always
  fsynced before anything that depends on them);
- log matching: two entries with the same (index, term) are identical
  (kind, data, position) and have the same predecessor term, so by induction
  their whole prefixes are identical;
- durability of term and vote before speech: a message in term T leaves only
  once T is durable; a granted vote only once it is durable;
- at the end (`dledger.testing.simulator`): every running replica's log
  equals the leader's up to the commit index, and no running node handed its
  state machine an entry other than the final log's at that index (a node
  that detected lost committed data and stopped is not running).

Checked only under flush=sync (`SafetyChecker(flush_async=False)`), because
flush=async may lose acknowledged writes by contract:
- leader completeness: a new leader holds every entry known committed, and
  no node lacking a committed entry could gather a quorum of votes;
- state-machine safety: an index is committed with one entry only, on every
  replica (committed entries are never lost or changed, and all replicas'
  committed prefixes are identical, position included);
- commit claims: whenever a node's commit index moves, the entry it names is
  durable on a quorum (the definition of committed);
- durability of acknowledgements: an acknowledgement of index i leaves only
  once i is durable; the latest committed entry is durable on a quorum after
  every crash;
- every write acknowledged as committed is in the final log exactly once
  (under flush=async: at most once).

Through snapshots (logs whose first index moved, `dledger.testing.statemachine`):
- snapshot matching: two snapshots taken at the same (index, term) hold the
  same state;
- state-machine safety: every node whose state machine reaches index i,
  by applying entries or by installing a snapshot, has the same state there;
  at the end, every running node's state equals the final log's prefix;
- the checks above that read a node's log (leader completeness, commit
  claims, durability) read a compacted entry through the node's snapshot.
Under flush=async a differing state or snapshot is counted
(`state_divergences`), not raised: the contract lets a quorum's power loss
replace committed entries, and a node that applied one of them is checked
at the end instead.

Membership changes (`dledger.membership`; the simulator's
`dledger.testing.membership`), in both modes unless marked:
- every committed configuration is a single-server change of the previous
  committed one, and a voter's pinned directory changes only from unpinned
  (anything else takes a rejoin, which makes it a learner) (sync only:
  async may replace committed entries);
- a leader's log holds at most one uncommitted CONFIG entry of its own term
  (one change in flight; checked by the simulator as the leader writes);
- identity: a data directory that replaced a wiped one is not entitled to
  vote until a CONFIG entry makes it a voter again (rejoin, then promote):
  no leader is elected from such a directory, and no leader counted a vote
  it granted (`observe_election`, which reads the grants the node counted);
- commit claims and the durability checks count voters only (of the
  claiming leader's configuration), each only with the directory it is
  pinned to; a voter whose directory is a wiped one's replacement counts as
  abstaining (it can vote for no one), never as a holder of anything; the
  look-ahead election check asks each possible candidate's own
  configuration which votes it would count.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from dledger.entry import Entry, EntryKind, HardState
from dledger.membership import UNPINNED, Membership, decode, single_server_change
from dledger.messages import AppendResponse, Message, VoteRequest, VoteResponse


class SafetyViolation(AssertionError):
    """An observed history broke a Raft safety property."""


# ----------------------------------------------------------- pure predicates


def check_leader_unique(leaders: Mapping[int, int], term: int, node_id: int) -> str | None:
    """Election safety: `node_id` leads `term` and no other node has."""
    other = leaders.get(term)
    if other is not None and other != node_id:
        return f"two leaders in term {term}: {other} and {node_id}"
    return None


def check_log_matching(
    seen: Mapping[tuple[int, int], tuple[Entry, int]], entry: Entry, prev_term: int
) -> str | None:
    """Log matching: `entry` agrees with every entry ever written at its (index, term)."""
    known = seen.get((entry.index, entry.term))
    if known is None:
        return None
    other, other_prev = known
    if other != entry:
        return f"log matching: {other} and {entry} share index and term"
    if other_prev != prev_term:
        return (
            f"log matching: entry {entry.index}/{entry.term} follows term {prev_term} "
            f"here and term {other_prev} elsewhere"
        )
    return None


def check_committed(committed: Mapping[int, Entry], entry: Entry) -> str | None:
    """State-machine safety: `entry` is the only entry ever committed at its index."""
    known = committed.get(entry.index)
    if known is not None and known != entry:
        return f"committed entry changed at index {entry.index}: {known} then {entry}"
    return None


def check_leader_complete(
    committed: Mapping[int, Entry],
    term_at: Callable[[int], int | None],
    leader: int,
    term: int,
    committed_in: Mapping[int, int] | None = None,
) -> str | None:
    """Leader completeness (§5.4): the leader of `term` holds every entry committed
    in an earlier term. `committed_in[index]` is the term the commit was first seen
    in (an upper bound of the term that committed it); without it, the entry's own
    term. A late winner of an old term (its votes delayed by a pause) need not
    hold what a later term committed meanwhile."""
    for index, entry in committed.items():
        since = committed_in.get(index, entry.term) if committed_in else entry.term
        if since < term and term_at(index) != entry.term:
            return (
                f"leader {leader} of term {term} lacks committed entry "
                f"{index}/{entry.term} (has term {term_at(index)})"
            )
    return None


def check_message_durable(
    msg: Message, durable: HardState, durable_term_at: Callable[[int], int | None]
) -> str | None:
    """A message may leave only once what it asserts is durable at its sender."""
    pre_vote = isinstance(msg, VoteRequest | VoteResponse) and msg.pre_vote
    if not pre_vote and msg.term > durable.term:
        return f"{msg} sent in term {msg.term} but durable term is {durable.term}"
    granted = isinstance(msg, VoteResponse) and msg.granted and not msg.pre_vote
    # A durable term beyond the vote's term also settles it: the node can
    # never vote in that term again (a stale duplicate grant is harmless).
    if granted and durable.term == msg.term and durable.vote != msg.dst:
        return f"vote for {msg.dst} in term {msg.term} sent before durable (disk: {durable})"
    match msg:
        case AppendResponse() if msg.success and msg.index > 0:
            if durable_term_at(msg.index) is None:
                return f"node {msg.src} acknowledged index {msg.index} before it was durable"
    return None


def check_electable_complete(
    committed: Entry,
    candidates: Mapping[int, tuple[bool, int, int]],
    voters: Mapping[int, tuple[int, int]],
    views: Mapping[int, tuple[frozenset[int], int]] | None = None,
) -> str | None:
    """Leader completeness, looking ahead: no node lacking a committed entry can be elected.

    `candidates` maps node -> (holds `committed`, last term, last index) of its
    log; `voters` maps node -> (last term, last index) of its *durable* log, the
    least it can remember after a crash. A candidate would get a vote from
    every voter whose log is not more up to date (§5.4.1). In correct Raft a
    quorum of durable logs holds the entry and refuses any candidate without
    it; a Figure-8 commit breaks this at once, before any crash is needed.

    `views[candidate]` (membership changes): the voters whose votes that
    candidate would count (its own configuration's, identity permitting) and
    its quorum size; without it every voter counts toward len(voters) // 2 + 1.
    """
    quorum = len(voters) // 2 + 1
    for node_id, (holds, last_term, last_index) in candidates.items():
        if holds:
            continue
        counted: Collection[int] = voters.keys()
        if views is not None:
            counted, quorum = views[node_id]
        votes = sum(
            1
            for v, (v_term, v_index) in voters.items()
            if v in counted
            and (last_term > v_term or (last_term == v_term and last_index >= v_index))
        )
        if votes >= quorum:
            return (
                f"node {node_id} (last {last_index}/{last_term}) lacks committed entry "
                f"{committed.index}/{committed.term} yet could win {votes} votes"
            )
    return None


def check_prefixes_identical(logs: Mapping[int, list[Entry]], upto: int) -> str | None:
    """All replicas hold byte-identical entries 1..upto (index, term, kind, data, position)."""
    reference: list[Entry] | None = None
    ref_id = 0
    for node_id, log in logs.items():
        if len(log) < upto:
            return f"node {node_id} has {len(log)} entries, fewer than committed {upto}"
        if reference is None:
            reference, ref_id = log, node_id
            continue
        for i in range(upto):
            if log[i] != reference[i]:
                return f"replicas {ref_id} and {node_id} differ at index {i + 1}"
    return None


def check_acked_exactly_once(
    acked: Iterable[bytes], final_log: list[Entry], may_lose: bool = False
) -> str | None:
    """Every proposal acknowledged as committed appears exactly once in the final log
    (at most once when `may_lose`: flush=async may lose it, never duplicate it)."""
    counts: dict[bytes, int] = {}
    for entry in final_log:
        counts[entry.data] = counts.get(entry.data, 0) + 1
    for data in acked:
        count = counts.get(data, 0)
        if count > 1 or (count == 0 and not may_lose):
            return f"acknowledged proposal {data!r} appears {count} times"
    return None


def check_claim_durable(
    node_id: int, entry: Entry, durable_term_at: list[Callable[[int], int | None]]
) -> str | None:
    """A commit index names an entry durable on a quorum (flush=sync's meaning of committed)."""
    holders = sum(1 for term_at in durable_term_at if term_at(entry.index) == entry.term)
    if holders < len(durable_term_at) // 2 + 1:
        return (
            f"node {node_id} set commit to {entry.index}/{entry.term}, durable on only "
            f"{holders} of {len(durable_term_at)} nodes"
        )
    return None


def check_claim_quorum(
    node_id: int, entry: Entry, holders: int, abstaining: int, voters: int
) -> str | None:
    """A leader's commit index names an entry durable on a quorum of its voters:
    `holders` voters hold it durably under their pinned directory, `abstaining`
    ones are replacements of wiped directories (they vote for no one)."""
    if holders + abstaining < voters // 2 + 1:
        return (
            f"node {node_id} set commit to {entry.index}/{entry.term}, durable on only "
            f"{holders} of {voters} voters" + (f" ({abstaining} abstaining)" if abstaining else "")
        )
    return None


def check_config_step(
    prev_index: int, prev: Membership, index: int, new: Membership
) -> str | None:
    """Committed configurations follow each other by single-server changes, and
    a voter that stays a voter keeps its pinned directory (or is pinned)."""
    if not single_server_change(prev, new):
        return (f"committed configuration {index} changes more than one voter after "
                f"{prev_index}: {sorted(prev.voter_ids)} -> {sorted(new.voter_ids)}")
    for node_id in prev.voter_ids & new.voter_ids:
        before = prev.member(node_id)
        after = new.member(node_id)
        assert before is not None and after is not None
        if before.directory_id not in (UNPINNED, after.directory_id):
            return (f"committed configuration {index} re-pins voter {node_id} from "
                    f"directory {before.directory_id} to {after.directory_id} without a rejoin")
    return None


def check_applied_match(
    node_id: int, applied: Mapping[int, Entry], final_log: list[Entry]
) -> str | None:
    """A running node's state machine saw exactly the final log's entries at their indexes."""
    for index in sorted(applied):
        entry = applied[index]
        if index > len(final_log) or final_log[index - 1] != entry:
            return (
                f"node {node_id} applied {entry.index}/{entry.term} but the group's log "
                f"has {final_log[index - 1] if index <= len(final_log) else 'nothing'} there "
                "and the node carried on"
            )
    return None


def check_snapshot_matching(
    snapshots: Mapping[tuple[int, int], int], index: int, term: int, digest: int
) -> str | None:
    """Snapshots at the same (index, term) hold the same state (log matching, summarised)."""
    known = snapshots.get((index, term))
    if known is not None and known != digest:
        return (f"snapshot matching: two snapshots at {index}/{term} hold different states "
                f"({known:#x} and {digest:#x})")
    return None


def check_state_matches(
    states: Mapping[int, tuple[int, int]], node_id: int, index: int, digest: int
) -> str | None:
    """State-machine safety: `node_id`'s state at `index` equals every other node's there.
    `states[index]` is (digest, node) of the first state seen at that index."""
    known = states.get(index)
    if known is not None and known[0] != digest:
        return (f"state-machine safety: node {node_id}'s state at index {index} ({digest:#x}) "
                f"differs from node {known[1]}'s ({known[0]:#x})")
    return None


def check_final_state(node_id: int, index: int, digest: int, expected: int | None) -> str | None:
    """A running node's state machine at `index` equals the group's final log up to it
    (`expected`: the digest of that prefix, None if the final log is shorter)."""
    if expected is None:
        return f"node {node_id}'s state machine is at {index}, past the group's log"
    if digest != expected:
        return (f"node {node_id}'s state at {index} ({digest:#x}) is not the group's log "
                f"up to there ({expected:#x}) and the node carried on")
    return None


def _anything_durable(index: int) -> int | None:
    return 0


# ------------------------------------------------------------------ history


@dataclass
class SafetyChecker:
    """History for the predicates above; every `observe_*` raises on a violation.

    `flush_async=True` drops the checks that need acknowledged writes to be
    durable (see the module docstring); `committed` then holds the latest
    entry seen committed at each index and `committed_lost` counts indexes
    whose committed entry was replaced (a loss the contract allows).
    """

    flush_async: bool = False

    def __post_init__(self) -> None:
        self.leaders: dict[int, int] = {}
        self.seen: dict[tuple[int, int], tuple[Entry, int]] = {}
        self.committed: dict[int, Entry] = {}
        # Term in which each committed index was first seen committed.
        self.committed_in: dict[int, int] = {}
        self.committed_lost = 0
        # Snapshots: (index, term) -> state digest; index -> (digest, node) of
        # the first state machine seen at that index.
        self.snapshots: dict[tuple[int, int], int] = {}
        self.states: dict[int, tuple[int, int]] = {}
        self.state_divergences = 0
        # Membership: the last committed configuration (index, config) and the
        # count of committed changes; directories that replaced a wiped one,
        # per node, until a CONFIG entry makes them a voter; granted votes
        # (term, voter, candidate) -> the voter's directory.
        self.bootstrap: Membership | None = None
        self.last_config: tuple[int, Membership] | None = None
        self.config_changes = 0
        self.replacement_dirs: dict[int, set[int]] = {}
        self.grants: dict[tuple[int, int, int], int] = {}

    @staticmethod
    def _raise(problem: str | None) -> None:
        if problem is not None:
            raise SafetyViolation(problem)

    def observe_leader(self, node_id: int, term: int, term_at: Callable[[int], int | None]) -> None:
        if self.leaders.get(term) == node_id:
            return
        self._raise(check_leader_unique(self.leaders, term, node_id))
        if not self.flush_async:
            self._raise(
                check_leader_complete(self.committed, term_at, node_id, term, self.committed_in)
            )
        self.leaders[term] = node_id

    def observe_written(self, entries: Iterable[Entry], prev_term: int) -> None:
        for entry in entries:
            self._raise(check_log_matching(self.seen, entry, prev_term))
            if (entry.index, entry.term) not in self.seen:
                self.seen[(entry.index, entry.term)] = (entry, prev_term)
                if entry.kind == EntryKind.CONFIG and self.replacement_dirs:
                    self._legitimise(decode(entry.data))
            prev_term = entry.term

    # -- identity

    def observe_wipe(self, node_id: int, new_directory: int) -> None:
        """`node_id` restarted on an empty data directory `new_directory`."""
        self.replacement_dirs.setdefault(node_id, set()).add(new_directory)

    def _legitimise(self, membership: Membership) -> None:
        for m in membership.voters:
            dirs = self.replacement_dirs.get(m.node_id)
            if dirs is not None and m.directory_id in dirs:
                dirs.discard(m.directory_id)

    def entitled(self, node_id: int, directory_id: int) -> bool:
        """May `node_id` vote from `directory_id` (not a wiped one's unpromoted replacement)?"""
        dirs = self.replacement_dirs.get(node_id)
        return not dirs or directory_id not in dirs

    def observe_election(self, leader: int, term: int, directory_id: int,
                         counted: Iterable[int]) -> None:
        """`leader` won `term` from `directory_id`, counting the grants of `counted`."""
        if not self.entitled(leader, directory_id):
            raise SafetyViolation(
                f"node {leader} elected in term {term} from directory {directory_id}, "
                "a wiped node's replacement not yet rejoined and promoted")
        for voter in counted:
            if voter == leader:
                continue
            granted_from = self.grants.get((term, voter, leader))
            if granted_from is None:
                raise SafetyViolation(
                    f"leader {leader} of term {term} counted a vote {voter} never granted")
            if not self.entitled(voter, granted_from):
                raise SafetyViolation(
                    f"leader {leader} of term {term} counted the vote of node {voter} from "
                    f"directory {granted_from}, a wiped node's replacement not yet promoted")

    def observe_committed(self, entries: Iterable[Entry], in_term: int | None = None) -> None:
        """`entries` are committed, as seen by a node in term `in_term` (default: each
        entry's own term, the earliest term that could have committed it)."""
        for entry in entries:
            problem = check_committed(self.committed, entry)
            if problem is not None:
                if not self.flush_async:
                    raise SafetyViolation(problem)
                self.committed_lost += 1
                self.committed_in.pop(entry.index, None)
            elif entry.kind == EntryKind.CONFIG and entry.index not in self.committed:
                self._committed_config(entry)
            self.committed[entry.index] = entry
            seen_in = max(entry.term, in_term) if in_term is not None else entry.term
            self.committed_in.setdefault(entry.index, seen_in)

    def _committed_config(self, entry: Entry) -> None:
        new = decode(entry.data)
        prev = self.last_config
        if prev is None and self.bootstrap is not None:
            prev = (0, self.bootstrap)
        if prev is not None and prev[0] < entry.index and not self.flush_async:
            self._raise(check_config_step(prev[0], prev[1], entry.index, new))
        if prev is None or prev[0] < entry.index:
            if prev is not None and prev[1].voter_ids != new.voter_ids:
                self.config_changes += 1
            self.last_config = (entry.index, new)

    def observe_claim(
        self, node_id: int, entry: Entry, durable_term_at: list[Callable[[int], int | None]]
    ) -> None:
        """`node_id` moved its commit index to `entry` (flush=sync only)."""
        if not self.flush_async:
            self._raise(check_claim_durable(node_id, entry, durable_term_at))

    def observe_sent(
        self, msg: Message, durable: HardState, durable_term_at: Callable[[int], int | None]
    ) -> None:
        # flush=async acknowledges written, unsynced entries by design.
        term_at = _anything_durable if self.flush_async else durable_term_at
        self._raise(check_message_durable(msg, durable, term_at))
        if isinstance(msg, VoteResponse) and msg.granted and not msg.pre_vote:
            self.grants.setdefault((msg.term, msg.src, msg.dst), msg.directory_id)

    def observe_snapshot(self, index: int, term: int, digest: int) -> None:
        """A node took or installed a snapshot of state `digest` at (index, term)."""
        problem = check_snapshot_matching(self.snapshots, index, term, digest)
        if problem is not None:
            if not self.flush_async:
                raise SafetyViolation(problem)
            self.state_divergences += 1
        self.snapshots[(index, term)] = digest

    def observe_state(self, node_id: int, index: int, digest: int) -> None:
        """`node_id`'s state machine reached `index` with state `digest`."""
        problem = check_state_matches(self.states, node_id, index, digest)
        if problem is None:
            self.states.setdefault(index, (digest, node_id))
            return
        if not self.flush_async:
            raise SafetyViolation(problem)
        self.state_divergences += 1
        self.states[index] = (digest, node_id)

    def latest_committed(self) -> Entry | None:
        return self.committed[max(self.committed)] if self.committed else None

    def observe_electable(
        self,
        candidates: Mapping[int, tuple[bool, int, int]],
        voters: Mapping[int, tuple[int, int]],
        views: Mapping[int, tuple[frozenset[int], int]] | None = None,
    ) -> None:
        latest = self.latest_committed()
        if latest is not None and not self.flush_async:
            self._raise(check_electable_complete(latest, candidates, voters, views))

    def observe_leader_claim(self, node_id: int, entry: Entry, holders: int, abstaining: int,
                             voters: int) -> None:
        """A leader moved its commit index to `entry` (flush=sync only)."""
        if not self.flush_async:
            self._raise(check_claim_quorum(node_id, entry, holders, abstaining, voters))

    def observe_durable_logs(
        self, durable_term_at: Mapping[int, Callable[[int], int | None]]
    ) -> None:
        """Committed entries survive crashes: the last one is durable on a quorum (sync only)."""
        if not self.committed or self.flush_async:
            return
        index = max(self.committed)
        term = self.committed[index].term
        holders = sum(1 for term_at in durable_term_at.values() if term_at(index) == term)
        if holders < len(durable_term_at) // 2 + 1:
            raise SafetyViolation(
                f"committed entry {index}/{term} durable on only {holders} of "
                f"{len(durable_term_at)} nodes"
            )
