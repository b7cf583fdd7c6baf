"""Distribution of the pure parsers and checks: in-process, or over Spark.

Both engines expose the same operations, so ``audit.run_audit`` does not
know which one it drives:

- ``read_small``: the few-byte files (checkpoint, hardstate, dispatch checkpoint);
- ``parse``: every segment, index and ConsumeQueue file, one task per file,
  returning the compact tables the driver needs (entries, index records,
  problems) and keeping messages and units where they are;
- ``queue_findings``: ``checks.check_queue`` per (group, topic, queue);
- ``duplicate_findings``: ``checks.find_duplicate_ids`` over the committed log;
- ``lookup``: committed messages matching client-history keys.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_audit import checks, fmt, inputs, parse
from spark_audit.inputs import FileInfo


def parse_file(info: FileInfo, buf, max_entry_size: int) -> dict[str, pa.Table]:
    """Dispatch one bulk file to its parser; returns tables by name."""
    ids = parse.FileId(info.gid, info.rid, info.fid)
    if info.kind == inputs.SEGMENT:
        r = parse.parse_segment(buf, info.start, ids, max_entry_size)
        return {"entries": r.entries, "messages": r.messages, "problems": r.problems}
    if info.kind == inputs.INDEX:
        t, p = parse.parse_index_file(buf, info.start, ids)
        return {"index": t, "problems": p}
    if info.kind == inputs.CQ:
        t, p = parse.parse_cq_file(buf, info.topic, info.queue_id, info.start, ids)
        return {"cq": t, "problems": p}
    raise ValueError(f"not a bulk file: {info.path}")


@dataclass
class Parsed:
    entries: pa.Table
    index: pa.Table
    problems: pa.Table
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def source_filter(table: pa.Table, sources: dict[int, list[tuple[int, int, int]]]) -> pa.Table:
    """Rows of the committed log, each read from its source replica."""
    mask = checks.in_sources(table.column("gid").to_numpy(), table.column("rid").to_numpy(),
                             table.column("index").to_numpy(), sources)
    return table.filter(pa.array(mask))


def split_by(table: pa.Table, keys: list[str]) -> dict[tuple, pa.Table]:
    """Group a table by key columns into zero-copy slices."""
    if not table.num_rows:
        return {}
    table = table.sort_by([(k, "ascending") for k in keys])
    kdf = table.select(keys).to_pandas()
    change = kdf.ne(kdf.shift()).any(axis=1).to_numpy()
    starts = [*np.nonzero(change)[0].tolist(), table.num_rows]
    out = {}
    for a, b in itertools.pairwise(starts):
        out[tuple(kdf.iloc[a].tolist())] = table.slice(a, b - a)
    return out


QUEUE_KEYS = ["gid", "topic", "queue_id"]


def run_queue_checks(msgs: pa.Table, units: pa.Table, ctxs: dict[int, checks.QueueContext],
                     max_examples: int) -> pa.Table:
    """``check_queue`` over every (group, topic, queue) present in either table."""
    m = split_by(msgs, QUEUE_KEYS)
    u = split_by(units, QUEUE_KEYS)
    found = []
    for key in sorted(set(m) | set(u)):
        ctx = ctxs.get(int(key[0]))
        if ctx is None:
            continue
        found.append(checks.check_queue(
            m.get(key, parse.MESSAGE_SCHEMA.empty_table()),
            u.get(key, parse.CQ_SCHEMA.empty_table()), ctx, max_examples))
    return checks.concat_findings(found)


def lookup_keys(msgs: pa.Table, keys: pa.Table) -> pa.Table:
    """Messages whose (gid, producer_id, sequence) or (gid, phys_offset) is in ``keys``."""
    cols = ["gid", "producer_id", "sequence", "phys_offset"]
    m = msgs.select(cols).to_pandas()
    k = keys.to_pandas()
    by_id = m.merge(k[k["producer_id"] != 0][["gid", "producer_id", "sequence"]]
                    .drop_duplicates(), on=["gid", "producer_id", "sequence"])
    by_off = m.merge(k[k["phys_offset"] >= 0][["gid", "phys_offset"]].drop_duplicates(),
                     on=["gid", "phys_offset"])
    both = pd.concat([by_id, by_off]).drop_duplicates()
    return pa.Table.from_pandas(both[cols], preserve_index=False)


class LocalEngine:
    """Everything in this process: the fast path for one machine and for tests."""

    name = "python"

    def __init__(self) -> None:
        self._msgs = parse.MESSAGE_SCHEMA.empty_table()
        self._cq = parse.CQ_SCHEMA.empty_table()
        self.lister = inputs.LOCAL

    def read_small(self, files: list[FileInfo]) -> dict[int, bytes]:
        out = {}
        for f in files:
            with open(inputs.local_path(f.path), "rb") as fh:
                out[f.fid] = fh.read()
        return out

    def parse(self, files: list[FileInfo], max_entry_size: int) -> Parsed:
        t0 = time.perf_counter()
        acc: dict[str, list[pa.Table]] = {k: [] for k in parse.TABLES}
        for f in files:
            # np.fromfile reads straight into one buffer: no per-record copies.
            buf = np.fromfile(inputs.local_path(f.path), dtype=np.uint8)
            for name, t in parse_file(f, memoryview(buf), max_entry_size).items():
                acc[name].append(t)
        tables = {k: _concat(v, parse.TABLES[k]) for k, v in acc.items()}
        self._msgs, self._cq = tables["messages"], tables["cq"]
        counts = {k: v.num_rows for k, v in tables.items()}
        return Parsed(tables["entries"], tables["index"], tables["problems"], counts,
                      time.perf_counter() - t0)

    def queue_findings(self, ctxs: dict[int, checks.QueueContext], max_examples: int
                       ) -> pa.Table:
        return run_queue_checks(self._msgs, self._cq, ctxs, max_examples)

    def duplicate_findings(self, sources: dict[int, list[tuple[int, int, int]]],
                           max_examples: int) -> pa.Table:
        msgs = source_filter(self._msgs, sources)
        msgs = msgs.filter(pc.not_equal(msgs.column("producer_id"), 0))
        return checks.find_duplicate_ids(msgs, max_examples)

    def lookup(self, keys: pa.Table, sources: dict[int, list[tuple[int, int, int]]]
               ) -> pa.Table:
        return lookup_keys(source_filter(self._msgs, sources), keys)

    def close(self) -> None:
        self._msgs = self._cq = None


def decode_small(kind: str, data: bytes):
    """Parse a small file by kind (raises ``fmt.FormatError``)."""
    if kind == inputs.CHECKPOINT:
        return fmt.parse_checkpoint(data)
    if kind == inputs.HARDSTATE:
        return fmt.parse_hardstate(data)
    return fmt.parse_dispatch_checkpoint(data)
