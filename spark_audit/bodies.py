"""Message bodies on each replica against the body digests a history recorded.

The chaos workload records, with every send, the CRC32C of the body it sent
(``body_crc32c``). A stored record with that client identity (producer id,
sequence) must hold exactly that body, on every replica. The replica
cross-check alone decides by majority, so when a majority of replicas is
rewritten consistently (valid CRCs) it would blame the healthy minority; the
digests say which version of an entry is the one that was sent:

- an entry version is *refuted* when any of its records carries a sent
  identity with another body;
- it is *confirmed* when it holds records of sent identities, all with the
  bodies sent.

``checks.check_group`` lets neither a refuted version win an index nor
count toward the quorum, and lets a confirmed version hold an index alone
when every other version there is refuted. Every replica holding a refuted
version gets a ``body_mismatch`` finding (check ``history``) naming its file,
the entry and the first record whose body differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from spark_audit import replicas
from spark_audit.checks import VIOLATION, Findings


@dataclass
class Verdicts:
    """Per entry identity (eid) of one group."""

    refuted: np.ndarray  # bool
    confirmed: np.ndarray  # bool
    # eid -> (pool row of its first refuted record, body CRC the history wants, where)
    first_bad: dict[int, tuple[int, int, str]]


def verdicts(g: replicas.Group, digests: pd.DataFrame | None) -> Verdicts:
    """Compare every decoded record of group ``g`` with the sent bodies (``digests``:
    producer_id, sequence, want_crc, where; see ``history.send_digests``)."""
    refuted = np.zeros(g.n_eids, bool)
    confirmed = np.zeros(g.n_eids, bool)
    first_bad: dict[int, tuple[int, int, str]] = {}
    pool = g.pool
    if digests is None or not len(digests) or not len(pool):
        return Verdicts(refuted, confirmed, first_bad)
    eid_of = np.repeat(np.arange(g.n_eids), np.diff(g.pool_start))
    recs = pd.DataFrame({"producer_id": pool["producer_id"], "sequence": pool["sequence"],
                         "row": np.arange(len(pool))})
    hit = recs[recs["producer_id"] != 0].merge(digests, on=["producer_id", "sequence"])
    if not len(hit):
        return Verdicts(refuted, confirmed, first_bad)
    rows = hit["row"].to_numpy()
    bad = pool["body_crc"][rows].astype(np.int64) != hit["want_crc"].to_numpy()
    np.logical_or.at(refuted, eid_of[rows[bad]], True)
    np.logical_or.at(confirmed, eid_of[rows[~bad]], True)
    confirmed &= ~refuted
    order = np.argsort(rows[bad], kind="stable")
    for row, want, where in zip(rows[bad][order], hit["want_crc"].to_numpy()[bad][order],
                                hit["where"].to_numpy()[bad][order], strict=True):
        first_bad.setdefault(int(eid_of[row]), (int(row), int(want), str(where)))
    return Verdicts(refuted, confirmed, first_bad)


def body_findings(g: replicas.Group, v: Verdicts, max_examples: int = 20) -> pa.Table:
    """A ``body_mismatch`` violation per replica and refuted entry it holds."""
    out = Findings()
    if not v.refuted.any():
        return out.table()
    for rid in sorted(g.replicas):
        rep = g.replicas[rid]
        rows = np.nonzero(v.refuted[rep.eid])[0] if len(rep.eid) else np.zeros(0, np.int64)
        for j in rows[:max_examples]:
            e = rep.entries[j]
            row, want, where = v.first_bad[int(rep.eid[j])]
            rec = g.pool[row]
            out.add("history", "body_mismatch", VIOLATION, gid=g.gid, rid=rid,
                    fid=int(rep.fid[j]), file_offset=int(e["file_offset"]),
                    index=int(e["index"]), phys_offset=int(rec["phys_offset"]),
                    detail=f"entry {int(e['index'])}: the record of producer "
                           f"{int(rec['producer_id']) & 0xFFFFFFFFFFFFFFFF:#x} sequence "
                           f"{int(rec['sequence'])} has body CRC {int(rec['body_crc']):#010x}, "
                           f"the body sent ({where}) has {want:#010x}")
        if len(rows) > max_examples:
            out.add("history", "body_mismatch", VIOLATION, gid=g.gid, rid=rid,
                    count=len(rows) - max_examples, detail="further occurrences not listed")
    return out.table()
