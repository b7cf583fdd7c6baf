"""Elections and configuration entries, checked as the messages leave.

`observe_elections` sees every message a node's transport sends (before the
network does) and keeps `World.configs` (configs.py) up to date: the votes
granted (with the directory each came from) and the CONFIG entries leaders
send. For a node that leads, it checks:

- *election safety*: one leader per term;
- *one change in flight*: a CONFIG entry of the leader's term is never past
  its commit index together with another CONFIG entry (the single-server
  rule leans on it: two pending changes may differ by two voters from the
  committed configuration);
- *the election itself*, the first time the leader of a term is seen: the
  leader was a voter of its configuration before the term (the one in
  effect at the entry before its first one of the term) under the directory
  it is pinned to, and not a wiped disk's replacement that no configuration
  made a voter again; every vote its elector counted
  (`Elector.elected_by`) is one a voter of that configuration granted, from
  the directory it is pinned to, and not from such a replacement; and the
  grants seen from legitimate voters (itself included) make a quorum of
  that configuration, however the elector counted.

A learner's vote, a vote from a wiped node that forgot what it voted for,
or a leader that is such a node, are each reported as what they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from dledger.membership import UNPINNED, Membership
from dledger.messages import AppendRequest, Message, VoteRequest, VoteResponse
from dledger.runtime.node import RaftGroupNode
from dledger.testing.nodesim.world import Slot, World
from election.roles import Role


def observe_elections(h: World, src: int, messages: Sequence[Message]) -> None:
    slot = h.slots[src]
    node = slot.node
    if node is None:
        return
    book = h.configs
    for msg in messages:
        if isinstance(msg, VoteResponse):
            if msg.granted and not msg.pre_vote:
                book.granted(msg.term, src, msg.dst, msg.directory_id)
        elif isinstance(msg, VoteRequest):
            if not book.entitled(src, slot.directory_id):
                h.counts["wiped_vote_requests"] += 1  # (to be refused: it forgot its votes)
        elif isinstance(msg, AppendRequest) and msg.entries:
            problem = book.observe_entries(msg.entries)
            if problem:
                h.fail(f"n{src} sent {problem}")
                return
    core = node.core
    if core is None or core.role is not Role.LEADER or node.failed is not None:
        return
    term = core.term
    pending = [i for i, _ in core.configs.items() if i > core.commit]
    # Counted with from its append on: it may commit earlier entries before
    # any message carries it (seed 7400664: entry 42 committed by 2 of the 3
    # voters of a removal no follower had received yet), and the durability
    # checks must know it before a follower applies those entries.
    for index, membership in core.configs.items():
        if index > core.commit:
            appended_term = core.log.term_or_none(index)
            if appended_term is not None:
                book.note_appended(index, appended_term, membership)
    if len(pending) > 1 and any(core.log.term_or_none(i) == term for i in pending):
        # (Entries of earlier terms above a restarted leader's commit index
        # may all be committed already: its saved commit index lags.)
        h.fail(f"n{src} proposed a configuration change in term {term} while another was "
               f"in flight (entries {pending}, commit {core.commit})")
        return
    known = book.leaders.get(term)
    if known is None:
        book.leaders[term] = src
        problem = _election_problem(h, slot, node, term)
        if problem:
            h.fail(f"n{src} elected in term {term}: {problem}")
    elif known != src:
        h.fail(f"two leaders in term {term}: n{known} and n{src}")


def _election_problem(h: World, slot: Slot, node: RaftGroupNode, term: int) -> str | None:
    core = node.core
    assert core is not None
    before = _config_before_term(node, term)
    book = h.configs
    me = before.member(slot.nid)
    if me is None or slot.nid not in before.voter_ids:
        return (f"it is not a voter of its configuration before the term "
                f"(voters {sorted(before.voter_ids)})")
    if me.directory_id not in (UNPINNED, slot.directory_id):
        return (f"it holds directory {slot.directory_id}, but its configuration pins it to "
                f"{me.directory_id}")
    if not book.entitled(slot.nid, slot.directory_id):
        return (f"its directory {slot.directory_id} replaced a wiped one and was never made a "
                "voter again (rejoin, then promote)")
    legitimate = {slot.nid}
    for voter in sorted(before.voter_ids - {slot.nid}):
        if any(_legitimate(h, before, voter, d) for d in book.grant_dirs(term, voter, slot.nid)):
            legitimate.add(voter)
    for voter in sorted(core.elector.elected_by - {slot.nid}):
        if voter not in before.voter_ids:
            role = "a learner" if voter in before.learner_ids else "no member"
            return f"its elector counted the vote of n{voter}, {role} of its configuration"
        dirs = book.grant_dirs(term, voter, slot.nid)
        if not dirs:
            return f"its elector counted a vote n{voter} never granted"
        if voter not in legitimate:
            return (f"its elector counted the vote of n{voter} from directory "
                    f"{sorted(dirs)}, not the one its configuration pins or a wiped disk's "
                    "replacement not rejoined and promoted")
    quorum = len(before.voters) // 2 + 1
    if len(legitimate) < quorum:
        return (f"only {sorted(legitimate)} of its voters {sorted(before.voter_ids)} granted "
                "it a vote they were entitled to")
    return None


def _legitimate(h: World, config: Membership, voter: int, directory_id: int) -> bool:
    member = config.member(voter)
    return member is not None and member.directory_id in (UNPINNED, directory_id) \
        and h.configs.entitled(voter, directory_id)


def _config_before_term(node: RaftGroupNode, term: int) -> Membership:
    """The configuration the node campaigned with: the one in effect at the
    entry before its first entry of `term` (a candidate's log does not
    change; as leader it appended from there)."""
    core = node.core
    assert core is not None
    log = core.log
    first = log.last_index
    while first > 0 and log.term_or_none(first) == term:
        first -= 1
    # Below the log's start, the configuration is the snapshot's (its base).
    return node.membership_at(max(first, log.first_index() - 1))
