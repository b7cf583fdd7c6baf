"""What the real-node simulator knows of a group's configurations and identities.

`ConfigBook` is the ground truth the membership checks compare the nodes
with; the harness fills it as things happen and never asks a node for it:

- every CONFIG entry that any leader sent, by (index, term), decoded
  (`observe_entries`, from the AppendRequests the transports see: a
  committed entry reached a quorum of at least two voters, so it left its
  leader in one), and every one a leader holds as it sends anything
  (`note_appended`: a leader counts with a configuration once appended, so
  it may commit earlier entries with it before any append carries it);
- the committed configurations (`note_committed`, from the durability
  checks' record of committed terms and from compaction), checked in index
  order once every index up to them was seen committed (`advance`: a node
  that installed a snapshot skips ahead), each to be a single-server change
  of the one before that re-pins no voter (flush=sync: under flush=async a
  power cut of a quorum may replace committed entries);
- identity: the data directories that replaced a wiped one
  (`replacement_dirs`), until a CONFIG entry makes that directory a voter
  again (rejoin, then promote: from then on the node may vote); the votes
  granted, by (term, voter, candidate), with the directory they came from;
  the leader of each term (election safety).

A directory is legitimised as soon as a leader *sends* the entry that
promotes it, not when that entry commits: a configuration takes effect on
append (docs/raft.md, "Membership changes"), so a node holding its own
promotion may legitimately campaign and win before the entry commits.
"""

from __future__ import annotations

from collections.abc import Iterable

from dledger.entry import Entry, EntryKind
from dledger.membership import UNPINNED, Membership, MembershipError, decode, single_server_change


class ConfigBook:
    """Configurations seen and committed, replaced directories, votes granted."""

    def __init__(self, bootstrap: Membership) -> None:
        self.bootstrap = bootstrap
        # (index, term) -> configuration of every CONFIG entry a leader sent.
        self.seen: dict[tuple[int, int], Membership] = {}
        # The committed configurations, index -> configuration (flush=sync).
        self.committed: dict[int, Membership] = {}
        self.last_committed: tuple[int, Membership] = (0, bootstrap)
        # Every index up to `through` was seen committed; `_known` holds the
        # ones seen above it.
        self.through = 0
        self._known: set[int] = set()
        self.committed_changes = 0  # committed entries that changed the voter set
        # node -> directories that replaced a wiped one and are not voters yet.
        self.replacement_dirs: dict[int, set[int]] = {}
        # (term, voter, candidate) -> directories the grant came from.
        self.grants: dict[tuple[int, int, int], set[int]] = {}
        # term -> the node that led it.
        self.leaders: dict[int, int] = {}

    # ----------------------------------------------------------- identities

    def wiped(self, node_id: int, new_directory: int) -> None:
        """`node_id` lost its disk and restarts under `new_directory`."""
        self.replacement_dirs.setdefault(node_id, set()).add(new_directory)

    def entitled(self, node_id: int, directory_id: int) -> bool:
        """May `node_id` vote from `directory_id` (not a wiped disk's replacement
        that no configuration has made a voter yet)?"""
        dirs = self.replacement_dirs.get(node_id)
        return not dirs or directory_id not in dirs

    def awaiting(self) -> set[int]:
        """Nodes holding a replacement directory not legitimised yet."""
        return {n for n, dirs in self.replacement_dirs.items() if dirs}

    def _legitimise(self, membership: Membership) -> None:
        for m in membership.voters:
            dirs = self.replacement_dirs.get(m.node_id)
            if dirs and m.directory_id in dirs:
                dirs.discard(m.directory_id)

    # ---------------------------------------------------------- configurations

    def observe_entries(self, entries: Iterable[Entry]) -> str | None:
        """Entries a leader sent; a problem if a CONFIG entry does not decode."""
        for entry in entries:
            if entry.kind != EntryKind.CONFIG:
                continue
            key = (entry.index, entry.term)
            if key in self.seen:
                continue
            try:
                membership = decode(entry.data)
            except MembershipError as exc:
                return f"CONFIG entry {entry.index} (term {entry.term}) does not decode: {exc}"
            self.seen[key] = membership
            self._legitimise(membership)
        return None

    def note_appended(self, index: int, term: int, membership: Membership) -> None:
        """A leader holds CONFIG entry (index, term) in its log: it counts with
        that configuration from now on, before any append carries it."""
        if (index, term) not in self.seen:
            self.seen[(index, term)] = membership
            self._legitimise(membership)

    def note_committed(self, index: int, term: int) -> None:
        """Entry (index, term) is seen committed (flush=sync), on a node's log
        or as a node deletes it below a snapshot."""
        if index <= self.through:
            return
        self._known.add(index)
        membership = self.seen.get((index, term))
        if membership is not None:
            self.committed[index] = membership

    def advance(self) -> str | None:
        """Check the committed configurations up to the first index not seen
        committed yet, in index order (a node that installed a snapshot skips
        ahead, so indexes are not seen in order): a problem if one is not a
        single-server change of the committed one before it, or re-pins a
        voter (that takes a rejoin, which makes it a learner first)."""
        while self.through + 1 in self._known:
            self.through += 1
            self._known.discard(self.through)
            membership = self.committed.get(self.through)
            if membership is None:
                continue
            prev_index, prev = self.last_committed
            self.last_committed = (self.through, membership)
            if prev.voter_ids != membership.voter_ids:
                self.committed_changes += 1
            problem = _step_problem(prev_index, prev, self.through, membership)
            if problem:
                return problem
        return None

    def committed_at(self, index: int) -> Membership | None:
        """The committed configuration in effect at `index`, None while not
        every index up to it was seen committed."""
        if index > self.through:
            return None
        best = max((i for i in self.committed if i <= index), default=0)
        return self.committed[best] if best else self.bootstrap

    def configs_after(self, index: int) -> list[Membership]:
        """Configurations some leader sent at an index above `index`: what a
        leader that committed `index` may have counted with (one change in
        flight, effective on append)."""
        return [m for (i, _), m in self.seen.items() if i > index]

    # ----------------------------------------------------------------- votes

    def granted(self, term: int, voter: int, candidate: int, directory_id: int) -> None:
        self.grants.setdefault((term, voter, candidate), set()).add(directory_id)

    def grant_dirs(self, term: int, voter: int, candidate: int) -> set[int]:
        return self.grants.get((term, voter, candidate), set())


def _step_problem(prev_index: int, prev: Membership, index: int, new: Membership) -> str | None:
    if not single_server_change(prev, new):
        return (f"committed configuration {index} changes more than one voter after "
                f"{prev_index}: {sorted(prev.voter_ids)} -> {sorted(new.voter_ids)}")
    for node_id in sorted(prev.voter_ids & new.voter_ids):
        before, after = prev.member(node_id), new.member(node_id)
        assert before is not None and after is not None
        if before.directory_id not in (UNPINNED, after.directory_id):
            return (f"committed configuration {index} re-pins voter {node_id} from directory "
                    f"{before.directory_id} to {after.directory_id} without a rejoin")
    return None
