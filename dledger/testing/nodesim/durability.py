"""Durability checks against the simulated disk's ground truth, as things happen.

The runtime's own counters trust its own idea of what is durable; these
checks ask the `SimFileSystem` what a power cut *now* would keep:

- *acks*: with flush=sync a follower's successful AppendResponse for index i
  leaves only once entry i is durable on that follower (checked as the
  transport sends it), and none leaves between the core's restore of a
  leader's snapshot and the end of its install;
- *checkpoints*: a checkpoint file, when it is replaced, vouches only for
  entries that are durable (recovery trusts it);
- *hard state*: the commit index saved never names an entry that is not
  durable (a restart replays up to it); every message but a pre-vote leaves
  only once its term is durable, a granted vote only once the vote (or a later
  term) is;
- *commits*: with flush=sync an entry any node applies, or a client is told
  is committed, is durable, with that term, on a quorum (nodes that are down count as
  holding it, since their files cannot be read without a restart);
- *committed entries never change* (flush=sync): every index seen committed
  on any node keeps its term on every node that commits it later;
- *commit claims* (flush=sync): a node's commit index is a claim, checked the
  moment it rises (on a leader, as the first message carrying it leaves):
  the entry it names is durable, with that term, on a quorum, and no node
  lacking it could win an election against the durable logs of the others
  (Raft's leader completeness, looking ahead: a Figure-8 commit breaks it at
  once, before the crash that would lose the entry). A leader that counts
  its own unsynced write, or a follower that commits a stale suffix, is
  caught at the claim rather than only if a later crash happens to expose it.

Quorums are of voters, never learners, each voter counted under the data
directory its configuration pins it to; a voter whose pinned directory was
wiped abstains (it can vote for nobody until it rejoined). Which
configuration: with membership changes the commit a node claims may have
been counted by its leader with the configuration in effect at the entry or
any later one (a configuration takes effect on append, one change in
flight), so a quorum of any of them will do (`quorum_configs`); the
look-ahead election asks each candidate's own configuration
(`electable_without`). Without membership changes both are the bootstrap
configuration, every node a voter.

Committed CONFIG entries are handed to `World.configs` as they are seen
committed (flush=sync), which checks each committed configuration against
the one before it (configs.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from commitlog.checkpoint import HardState, decode_hard_state, read_checkpoint, read_hard_state
from commitlog.install import MARKER as INSTALL_MARKER
from dledger.membership import UNPINNED, Membership
from dledger.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    Message,
    VoteRequest,
    VoteResponse,
)
from dledger.raw_node import stored_membership
from dledger.runtime.node import RaftGroupNode
from dledger.runtime.snapshot_transfer import SnapshotAck
from dledger.testing.nodesim.world import Slot, World

# (last term, last index) of a voter no candidate's log is as up to date as.
UNBEATABLE_LOG = (1 << 62, 1 << 62)
# Bytes to read for the whole hard-state file (a few dozen bytes long).
HARD_STATE_READ_BYTES = 1 << 16


def readable(slot: Slot) -> bool:
    """The node runs and its view of its files can be asked. A node that
    failed (on an injected disk fault, say) and is not restarted yet counts
    as down: the operation that failed may have left its in-memory log and
    index half changed (seed 12003390: a failed install left the index empty
    under a log of 1..29), and only a restart reads its files again."""
    node = slot.node
    return slot.state == "up" and node is not None and node.failed is None


def durable(h: World, slot: Slot, index: int) -> bool:
    """Entry `index` of the node's log (as it reads now) would survive a power cut."""
    node = slot.node
    assert node is not None
    log = node.log
    if index < log.first_index:
        return True
    if index > log.last_index:
        return False
    assert log.index is not None and log.segments is not None, "the node's log is closed"
    record = log.index.read(index)  # queued records are served from memory
    assert record is not None, f"no index record for entry {index}"
    base = log.segments.base_of(record.position)
    path = log.segments.path(base)
    size = record.size
    at = record.position - base
    kept = h.fs.durable_slice(path, at, size)
    return kept is not None and kept == h.fs.volatile_slice(path, at, size)


def durable_hard_state(h: World, slot: Slot) -> HardState:
    path = os.path.join(slot.data_dir, "hardstate")
    raw = h.fs.durable_slice(path, 0, HARD_STATE_READ_BYTES)
    return decode_hard_state(path, raw) if raw else HardState()


def observe_send(h: World, node_id: int, messages: Sequence[Message]) -> None:
    slot = h.slots[node_id]
    if slot.node is None:
        return
    hs: HardState | None = None
    for msg in messages:
        if isinstance(msg, (VoteRequest, VoteResponse)) and msg.pre_vote:
            continue
        if isinstance(msg, SnapshotAck):
            # A transfer acknowledgement echoes its offer's term and says only
            # which bytes are staged (a node whose disk was just wiped answers
            # the chunks of a transfer still aimed at its predecessor): the
            # install itself is acknowledged by the core, after its term is
            # durable.
            continue
        if hs is None:
            hs = durable_hard_state(h, slot)
        if msg.term > hs.term:
            h.fail(f"n{node_id} sent {type(msg).__name__} of term {msg.term} to n{msg.dst} "
                   f"while its durable term is {hs.term}")
        elif isinstance(msg, VoteResponse) and msg.granted and hs.term == msg.term \
                and hs.vote != msg.dst:
            # (A durable later term also binds: no second vote in this one.)
            h.fail(f"n{node_id} granted its vote to n{msg.dst} in term {msg.term} before "
                   f"the vote was durable (durable: term {hs.term} vote {hs.vote})")
    if h.flush != "sync":
        return
    core = slot.node.core
    restored = core.log.unstable_snapshot if core is not None else None
    pending = restored is not None and slot.node.install_pending
    for msg in messages:
        if pending and isinstance(msg, AppendResponse) and msg.success \
                and restored is not None and msg.index >= restored.index:
            # The core restored a snapshot the runtime has not installed: its
            # files do not hold that entry yet. (An ack below it answers an
            # earlier append, durable in the log being replaced, and held by
            # the installed one or covered by its snapshot.)
            h.fail(f"n{node_id} acknowledged entry {msg.index} to n{msg.dst} before the "
                   f"snapshot {restored.index} it restored was installed")
        if isinstance(msg, (AppendRequest, Heartbeat)):
            check_claim(h, slot, msg.commit)
        if isinstance(msg, AppendResponse) and msg.success and msg.index \
                and not durable(h, slot, msg.index):
            h.fail(f"n{node_id} acknowledged entry {msg.index} to n{msg.dst} before it was "
                   "durable")


def check_acked(h: World, slot: Slot, index: int, term: int, what: str) -> None:
    """Entry `index` of `term` was applied, or a client told it committed
    (flush=sync): it must be durable on a quorum of the voters of a
    configuration the committing leader may have counted with
    (`quorum_configs`), each voter only under the directory it is pinned to
    (`_holders`)."""
    if h.flush != "sync":
        return
    held: set[int] = set()
    for other in h.slots.values():
        node = other.node
        if not readable(other):
            held.add(other.nid)  # cannot tell without reading its files: assume it does
            continue
        assert node is not None
        log = node.log
        if index < log.first_index:
            held.add(other.nid)  # deleted below a snapshot: committed and applied there
        elif index <= log.last_index and log.term_at(index) == term \
                and durable(h, other, index):
            held.add(other.nid)
    best, voters = -1, 0
    for membership in quorum_configs(h, slot, index):
        count = _holders(h, membership, held)
        if count >= len(membership.voters) // 2 + 1:
            return
        if count > best:
            best, voters = count, len(membership.voters)
    h.fail(f"n{slot.nid} {what} entry {index} (term {term}), but it is durable on {best} "
           f"of {voters} voters")


def _holders(h: World, membership: Membership, held: set[int]) -> int:
    """Voters of `membership` that hold the entry (those in `held`) under the
    directory they are pinned to, plus those whose pinned directory was
    wiped: such a node cannot vote until it rejoined (it refuses every
    candidate and no candidate counts it), so it abstains, and a quorum that
    lost a disk still keeps any node lacking the entry from being elected
    (`electable_without` checks that separately)."""
    count = 0
    for m in membership.voters:
        directory = h.slots[m.node_id].directory_id
        if m.directory_id not in (UNPINNED, directory) or m.node_id in held:
            count += 1
    return count


def _view(node: RaftGroupNode) -> Membership:
    """The configuration the node acts on: its core's, or, while it is being
    restarted (its CommitLog open, its core not made yet), the one its core
    will read from its stored log. Not its `membership` property, which
    gives the bootstrap configuration before start: a restarted node taken to
    campaign under the bootstrap voters looked electable by removed nodes
    (seed 16100146, a false violation)."""
    if node.core is not None:
        return node.membership
    return stored_membership(node.storage, node.config.bootstrap_membership())


def quorum_configs(h: World, slot: Slot, index: int) -> list[Membership]:
    """The configurations a leader that committed `index` may have counted
    with, as far as the node in `slot` and the run can tell: its own in effect
    at `index` and every later one in its log (a leader counts with the
    configuration in effect, which may be one change past the committed one),
    and (membership runs) every configuration any leader sent past it (a
    follower may not have received the leader's newest yet)."""
    node = slot.node
    core = node.core if node is not None else None
    if core is None:
        return [_view(node) if node is not None else h.configs.bootstrap]
    base = core.configs.at(index)[0]
    out = [m for i, m in core.configs.items() if i >= base]
    if h.membership:
        out += h.configs.configs_after(base)
    return out


def durable_last(h: World, slot: Slot) -> tuple[int, int]:
    """(term, index) of the last entry of the node's log a power cut now would
    keep (the durable part of a log is a prefix of it)."""
    node = slot.node
    assert node is not None
    log = node.log
    lo, hi = log.first_index - 1, log.last_index  # durable(lo) holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if durable(h, slot, mid):
            lo = mid
        else:
            hi = mid - 1
    if lo >= log.first_index:
        return log.term_at(lo), lo
    try:
        return node.storage.term(lo), lo  # below the log: its snapshot's term
    except LookupError:
        return 0, lo


def check_claim(h: World, slot: Slot, commit: int) -> None:
    """The node claims entries up to `commit` committed (flush=sync; once per
    rise of its claim per incarnation)."""
    node = slot.node
    key = (slot.nid, slot.incarnation)
    if h.flush != "sync" or node is None or commit <= h.claimed.get(key, 0):
        return
    h.claimed[key] = commit
    log = node.log
    if commit < log.first_index or commit > log.last_index:
        return  # compacted (committed long ago), or a claim the log cannot name yet
    # The claim names the core's entry. Its files can still hold an older
    # one there: a follower's core that truncated its log (a new leader's
    # entries replace its tail) commits before the driver has written the
    # replacement, which comes with the Ready still out (seed 19100618, a
    # slow disk: the files' entry 57 of term 2 was taken for the claim on
    # the core's 57 of term 3, a false violation). What the driver reads
    # (applies, saves as the commit index) stops at the core's stable
    # index, which the truncation lowered.
    core = node.core
    term = core.log.term_or_none(commit) if core is not None else None
    if term is None:
        term = log.term_at(commit)
    check_acked(h, slot, commit, term, "claims committed")
    problem = electable_without(h, commit, term)
    if problem:
        h.fail(f"n{slot.nid} claims entry {commit} (term {term}) committed, but {problem}")


def electable_without(h: World, commit: int, term: int) -> str | None:
    """Raft's leader completeness, looking ahead: a node lacking entry
    (commit, term) that could win an election now against the durable logs
    of the others (`dledger.invariants.check_electable_complete`, with each
    candidate's own configuration: its voters, the votes it would count, and
    the votes each voter would grant it).

    A candidate is a running node its own configuration lets campaign (a
    voter, under the directory it is pinned to). A voter grants its vote to a
    candidate whose log is at least as up to date as its durable log, unless
    its configuration pins the candidate to another directory; a voter that
    is down, or holds a wiped disk's replacement directory, grants nothing
    (the replacement refuses to vote until it rejoined: it forgot its votes).
    The candidate counts a grant only from the directory it pins that voter
    to (any, if unpinned)."""
    voters: dict[int, tuple[int, int]] = {}
    for other in h.slots.values():
        if not readable(other) or not h.configs.entitled(other.nid, other.directory_id):
            # A node that is down cannot be read without a restart: as a
            # candidate it is taken to hold the entry, as a voter to refuse
            # everyone (the check stays sound, only weaker).
            voters[other.nid] = UNBEATABLE_LOG
        else:
            voters[other.nid] = durable_last(h, other)
    for cand in h.slots.values():
        cnode = cand.node
        if not readable(cand) or cnode is None:
            continue  # down, or failed: it campaigns only after a restart
        view = _view(cnode)
        if not view.can_vote(cand.nid, cand.directory_id):
            continue  # it never campaigns
        clog = cnode.log
        if (clog.first_index <= commit <= clog.last_index and clog.term_at(commit) == term) \
                or commit < clog.first_index:
            continue
        last_index = clog.last_index
        last_term = clog.term_at(last_index)
        votes = 0
        for m in view.voters:
            vslot = h.slots[m.node_id]
            if m.directory_id not in (UNPINNED, vslot.directory_id):
                continue  # not counted: another directory answers for that voter
            vnode = vslot.node
            if vnode is not None and vslot is not cand \
                    and not _view(vnode).identity_matches(cand.nid, cand.directory_id):
                continue  # it refuses a candidate pinned to another directory
            v_term, v_index = voters[m.node_id]
            if last_term > v_term or (last_term == v_term and last_index >= v_index):
                votes += 1
        if votes >= len(view.voters) // 2 + 1:
            return (f"node {cand.nid} (last {last_index}/{last_term}) lacks committed entry "
                    f"{commit}/{term} yet could win {votes} votes")
    return None


def check_commits(h: World) -> None:
    """Committed entries never change, and every rise of a node's commit index
    is a checked claim (flush=sync): polled by the client."""
    if h.flush != "sync":
        return
    seen = h.committed_terms
    for slot in h.slots.values():
        node = slot.node
        if slot.state != "up" or node is None or node.failed is not None \
                or node.install_pending:
            continue  # (an install pending: its commit index is ahead of its files)
        check_claim(h, slot, node.commit_index)
        if h.violation:
            return
        log = node.log
        # Only the prefix the files hold as the core does (see check_claim).
        top = min(node.commit_index, log.last_index,
                  node.core.stable_index if node.core is not None else log.last_index)
        start = max(h.commit_checked.get(slot.nid, 0), log.first_index - 1)
        for index in range(start + 1, top + 1):
            term = log.term_at(index)
            known = seen.setdefault(index, term)
            if known != term:
                h.fail(f"n{slot.nid} committed entry {index} in term {term}, but term {known} "
                       "was committed there before")
                return
            if h.membership:
                h.configs.note_committed(index, term)
        h.commit_checked[slot.nid] = top
    if h.membership:
        problem = h.configs.advance()
        if problem:
            h.fail(problem)


def observe_replace(h: World, path: str) -> None:
    data_dir, name = os.path.split(path)
    slot = next((s for s in h.slots.values() if s.data_dir == data_dir), None)
    if slot is None or slot.node is None or name not in ("checkpoint", "hardstate"):
        return  # a ConsumeQueue checkpoint, or a node still opening its log
    if name == "checkpoint":
        if h.fs.volatile_slice(os.path.join(data_dir, INSTALL_MARKER), 0, 1) is not None:
            # Written by `CommitLog.install` while it swaps the node's files
            # (the log object is between two sets of segments): it vouches
            # for the staged segments the install verified and fsynced.
            return
        ck = read_checkpoint(data_dir)
        if ck is not None and ck.durable_index >= ck.first_index \
                and not durable(h, slot, ck.durable_index):
            h.fail(f"n{slot.nid} checkpoint vouches for entry {ck.durable_index}, which is "
                   "not durable")
    else:
        hs = read_hard_state(data_dir)
        if hs is not None and hs.commit and not durable(h, slot, hs.commit):
            h.fail(f"n{slot.nid} saved commit index {hs.commit}, whose entry is not durable")
