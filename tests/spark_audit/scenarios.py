"""Replica sets for the audit tests: a clean group and one group per injected fault."""

from __future__ import annotations

import json
import os

from spark_audit import fmt

from .replica_builder import (
    Entry,
    Layout,
    Msg,
    flip_byte,
    make_log,
    rewrite_entry_term,
    set_cq_unit_offset,
    truncate_log,
    write_replica,
)

NODES = ("n1", "n2", "n3")
SEGMENT = 16 * 1024
UNITS = 50


def batches(n_entries: int, per_entry: int = 4, producer: int = 0xABCDEF0123456789,
            body: int = 300) -> list[list[Msg]]:
    """Messages over two topics and three queues, each with a client identity."""
    out = []
    for i in range(n_entries):
        out.append([Msg("orders" if (i + j) % 2 else "audit-log", (i * per_entry + j) % 3,
                        bytes([65 + j]) * body, tags=b"tagA" if j % 2 else b"",
                        producer_id=producer, sequence=i * per_entry + j)
                    for j in range(per_entry)])
    return out


def write_group(root: str, log: list[Entry], **kw) -> dict[str, Layout]:
    kw.setdefault("segment_size", SEGMENT)
    kw.setdefault("units_per_file", UNITS)
    kw.setdefault("index_file_records", 64)
    return {n: write_replica(os.path.join(root, n), log, **kw) for n in NODES}


def clean(root: str, n_entries: int = 120) -> dict[str, Layout]:
    return write_group(root, make_log(batches(n_entries)))


def divergent_term(root: str) -> dict[str, Layout]:
    """n2's entry 40 rewritten with another term (valid CRCs): a committed divergence."""
    lay = clean(root)
    rewrite_entry_term(lay["n2"], 40, 7)
    return lay


def truncated(root: str) -> dict[str, Layout]:
    """n3 lost its last 30 entries although its checkpoint and hardstate cover them."""
    lay = clean(root)
    truncate_log(lay["n3"], 90)
    return lay


def duplicated(root: str) -> dict[str, Layout]:
    """A message stored twice: entry 60 repeats a message of entry 10."""
    b = batches(120)
    b[59] = [*b[59], b[9][1]]
    return write_group(root, make_log(b))


def cq_wrong_position(root: str) -> dict[str, Layout]:
    """n1's ConsumeQueue slot 5 of orders/1 points at the message of slot 6."""
    lay = clean(root)
    units = lay["n1"].units[("orders", 1)]
    set_cq_unit_offset(lay["n1"], "orders", 1, 5, units[6][1], UNITS)
    return lay


def flipped_byte(root: str) -> dict[str, Layout]:
    """One bit of a message body flipped on n2, inside entry 33."""
    lay = clean(root)
    p = lay["n2"].entry(33)
    flip_byte(lay["n2"].segment_path(p.segment), p.position - p.segment + 48 + 200)
    return lay


def uncommitted_tail(root: str) -> dict[str, Layout]:
    """Replicas agree up to the commit (100); n3 has a different uncommitted tail."""
    log = make_log(batches(110))
    other = make_log(batches(10, producer=5), term=2, first_index=101)
    lay = {n: write_replica(os.path.join(root, n), log, segment_size=SEGMENT,
                            units_per_file=UNITS, index_file_records=64, commit=100)
           for n in NODES[:2]}
    lay["n3"] = write_replica(os.path.join(root, "n3"), log[:100] + other,
                              segment_size=SEGMENT, units_per_file=UNITS,
                              index_file_records=64, commit=100)
    return lay


def under_replicated(root: str) -> dict[str, Layout]:
    """n1 claims commit 120 but n2 and n3 only hold 100 entries."""
    log = make_log(batches(120))
    lay = {"n1": write_replica(os.path.join(root, "n1"), log, segment_size=SEGMENT,
                               units_per_file=UNITS, index_file_records=64)}
    for n in NODES[1:]:
        lay[n] = write_replica(os.path.join(root, n), log[:100], segment_size=SEGMENT,
                               units_per_file=UNITS, index_file_records=64, commit=100)
    return lay


SCENARIOS = {
    "clean": clean,
    "divergent_term": divergent_term,
    "truncated": truncated,
    "duplicated": duplicated,
    "cq_wrong_position": cq_wrong_position,
    "flipped_byte": flipped_byte,
    "uncommitted_tail": uncommitted_tail,
    "under_replicated": under_replicated,
}


def write_history(path: str, group: str, layout: Layout, missing: bool) -> None:
    """Acks and polls for every committed message; ``missing`` adds an ack for a phantom."""
    ops = []
    n = 0
    for p in layout.entries:
        if p.kind != fmt.KIND_MESSAGES:
            continue
        for topic, qid, off, _size, _th in p.messages:
            seq = len(ops) // 2
            v = {"topic": topic, "queue": qid, "producer_id": 0xABCDEF0123456789,
                 "sequence": seq, "msg_id": f"{group}@{off:016X}", "group": group}
            ops.append({"index": n, "time_ns": n * 1000, "process": 1, "type": "ok",
                        "f": "send", "value": v})
            ops.append({"index": n + 1, "time_ns": n * 1000 + 1, "process": 2, "type": "ok",
                        "f": "poll", "value": v})
            n += 2
    if missing:
        ops.append({"index": n, "time_ns": n * 1000, "process": 1, "type": "ok", "f": "send",
                    "value": {"topic": "orders", "queue": 0, "producer_id": 99,
                              "sequence": 12345, "msg_id": f"{group}@{10**9:016X}",
                              "group": group}})
    ops.append({"index": n + 1, "time_ns": 0, "process": "nemesis", "type": "info",
                "f": "partition", "value": None})
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(o) for o in ops) + "\n")
