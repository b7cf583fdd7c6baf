"""The end-of-run checks of the real-node simulator.

After the liveness phase every node that is not stopped on a (flush=async)
committed divergence is up, caught up and applied to the leader's commit
index. Then:

- every node's committed log equals the leader's (index, term, body), over
  what each still holds (with compaction a log starts past 1; the entries
  deleted below the leader's first index are taken from `World.compacted`,
  under flush=async from the leader's own deletions where it made them:
  the first node to delete an index may have held an entry the group lost);
- no client proposal is in the final log twice;
- flush=sync: every acknowledged proposal is in the final log at the index and
  term it was acknowledged with;
- what every node applied, replays after restarts included, equals the final
  log at each index (flush=async: only the current incarnations since their
  last snapshot install, since power cuts may legitimately lose committed
  entries there, counted as `async_rewritten_before_install` when an
  install replaced what a node had applied of them);
- the state machines agree with themselves (`Applier.check`) and with each
  other (`Applier.summary`).

Membership runs: the nodes outside the final configuration (removed ones
that kept running, spares never added) need not have caught up, so only the
members' state machines are compared; under flush=sync every node's
committed entries and everything it applied are still checked against the
final log. Under flush=async a non-member is not: the power cut of a quorum
may have taken entries it committed (the contract allows it), and it hears
from no leader that would show it the divergence and stop it, as a member
does.
"""

from __future__ import annotations

from collections import Counter

from dledger.testing.nodesim.apply import digest, read_committed
from dledger.testing.nodesim.world import World


def final_checks(h: World) -> str | None:
    leader = h.leader()
    if leader is None or leader.node is None:
        return "no leader at the end"
    commit = leader.node.commit_index
    lead_log = leader.node.log
    final = {i: v for i, v in h.compacted.items() if i < lead_log.first_index}
    if h.flush == "async":
        # The first node to delete an index may have held a committed entry
        # the group later lost and rewrote (seed 20800104: n3 compacted
        # entry 34 of term 5, the group went on with 34 of term 6, and n3
        # stopped on the divergence): below its log, the group's history is
        # what the leader itself deleted, where it did.
        own = h.compacted_by.get(leader.nid, {})
        final.update((i, v) for i, v in own.items() if i < lead_log.first_index)
    final.update((e.index, (e.term, digest(e.body)))
                 for e in read_committed(lead_log, lead_log.first_index, commit))
    live = [s for s in h.slots.values() if s.state == "up" and s.node is not None]
    members = h.members()
    for slot in live:
        assert slot.node is not None
        if h.flush == "async" and slot.nid not in members:
            continue  # (see the module docstring)
        for e in read_committed(slot.node.log, slot.node.log.first_index,
                                slot.node.commit_index):
            if final.get(e.index) != (e.term, digest(e.body)):
                return (f"n{slot.nid} committed entry {e.index} (term {e.term}) differs from "
                        f"the leader n{leader.nid}'s {final.get(e.index)}")
    seen = Counter(d for _, d in final.values() if d in h.by_digest)
    twice = [h.by_digest[d].seq for d, n in seen.items() if n > 1]
    if twice:
        return f"proposals {sorted(twice)[:5]} are in the final log more than once"
    if h.flush == "sync":
        for p in h.proposals:
            if p.outcome != "acked":
                continue
            if final.get(p.index) != (p.term, digest(p.body)):
                return (f"acknowledged proposal {p.seq} (index {p.index}, term {p.term}) is "
                        f"not in the final log there: {final.get(p.index)}")
    for slot in h.slots.values():
        incarnations = list(slot.applied.items())
        if h.flush == "async":
            if slot.state == "diverged" or slot.nid not in members:
                continue
            records = slot.applied.get(slot.incarnation, [])
            # A snapshot install replaced the state the records before it
            # built. Under async those may name committed entries the group
            # lost (their other holder's power cut) and rewrote: the node,
            # cut off meanwhile, learns of the new history only from a
            # snapshot, which cannot show the contradiction (seed 19100317).
            since = slot.installed_after.get(slot.incarnation, 0)
            if any(final.get(index) != (term, dig) for index, term, dig in records[:since]):
                h.counts["async_rewritten_before_install"] += 1
            incarnations = [(slot.incarnation, records[since:])]
        for incarnation, records in incarnations:
            for index, term, dig in records:
                if final.get(index) != (term, dig):
                    return (f"n{slot.nid}#{incarnation} applied entry {index} (term {term}) "
                            f"but the final log has {final.get(index)}")
    summaries = {}
    for slot in live:
        assert slot.applier is not None
        problem = slot.applier.check()
        if problem:
            return f"n{slot.nid} state machine: {problem}"
        if slot.nid in members:
            summaries[slot.nid] = slot.applier.summary()
    if len({repr(v) for v in summaries.values()}) > 1:
        return f"state machines differ: {summaries}"
    return None
