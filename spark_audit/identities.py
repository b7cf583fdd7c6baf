"""The replicas' ``IDENTITY`` files against each other, group by group.

Each data directory names the cluster and the node it belongs to and carries
a random directory id (docs/storage-format.md, "Identity"). The broker
checks its own file when it starts; only a view of every replica at once can
see what no single node can:

- ``identity_cluster_mismatch``: a replica names another cluster than the
  rest of its group (a directory from elsewhere mounted here);
- ``identity_node_shared``: two replicas say they are the same node;
- ``identity_directory_shared``: two replicas carry the same directory id,
  that is one directory copied to make another node. The group pins each
  voter's directory id so that a wiped disk cannot vote twice; a copy
  defeats that: both hold the same votes and log, and Raft would count one
  disk's acknowledgements twice.

All three are violations of the ``divergence`` check (the replicas disagree
about who they are), reported on every replica involved, since the audit
cannot tell the original from the copy. A replica without ``IDENTITY`` is
reported as info (``no_identity``): a directory written before identities
existed, which the broker adopts with a new identity when it next starts. A
damaged or newer-format file was reported by ``prepare`` already and takes
no part here.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from spark_audit import inputs
from spark_audit.checks import INFO, VIOLATION, Findings, GroupState


def check(groups: dict[int, GroupState], files: list[inputs.FileInfo], out: Findings) -> None:
    """Add the identity findings of every group to ``out``."""
    has_file = {(f.gid, f.rid) for f in files if f.kind == inputs.IDENTITY}
    for gid, state in groups.items():
        for rid, meta in state.replicas.items():
            if (gid, rid) not in has_file:
                out.add("divergence", "no_identity", INFO, gid=gid, rid=rid,
                        detail=f"{meta.name} has no IDENTITY: a directory from before "
                               "identities, adopted with a new one when its node next starts")
        _check_group(state, out)


def _check_group(state: GroupState, out: Findings) -> None:
    named = {rid: meta.identity for rid, meta in state.replicas.items()
             if meta.identity is not None}
    names = {rid: meta.name for rid, meta in state.replicas.items()}

    clusters = Counter(ident.cluster_id for ident in named.values())
    if len(clusters) > 1:
        (top, n_top), (_, n_next) = clusters.most_common(2)
        group_cluster = top if n_top > n_next else None  # a tie names no cluster as the group's
        for rid, ident in sorted(named.items()):
            if ident.cluster_id == group_cluster:
                continue
            others = sorted(f"{names[r]}: {i.cluster_id!r}" for r, i in named.items() if r != rid)
            out.add("divergence", "identity_cluster_mismatch", VIOLATION, gid=state.gid, rid=rid,
                    detail=f"{names[rid]}'s IDENTITY names cluster {ident.cluster_id!r}; "
                           f"the group's other replicas: {', '.join(others)}")

    for field, kind, why in (
            ("node_id", "identity_node_shared", "two directories of one node"),
            ("directory_id", "identity_directory_shared",
             "one data directory copied to another; Raft would count its votes and "
             "acknowledgements twice")):
        holders: dict[int, list[int]] = defaultdict(list)
        for rid, ident in named.items():
            holders[getattr(ident, field)].append(rid)
        for value, rids in sorted(holders.items()):
            if len(rids) < 2:
                continue
            who = " and ".join(names[r] for r in sorted(rids))
            for rid in sorted(rids):
                out.add("divergence", kind, VIOLATION, gid=state.gid, rid=rid,
                        detail=f"{who} carry the same {field.replace('_', ' ')} ({value}) in "
                               f"IDENTITY: {why}")
