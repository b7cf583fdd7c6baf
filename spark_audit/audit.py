"""The audit run: inputs, parse, checks, results; independent of the engine."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import pyarrow as pa

from spark_audit import checks, engine, fmt, history, inputs
from spark_audit.checks import INFO, VIOLATION, Findings


@dataclass
class AuditOptions:
    specs: list[str]
    history: list[str] = field(default_factory=list)
    max_entry_size: int = fmt.DEFAULT_MAX_ENTRY_SIZE
    segment_size: int = 0  # 0: inferred from segment file names
    max_examples: int = 20


@dataclass
class AuditResult:
    replicas: list[inputs.Replica]
    files: list[inputs.FileInfo]
    groups: dict[int, checks.GroupState]
    findings: pa.Table
    counts: dict[str, int]
    history_stats: dict
    timings: dict[str, float]

    @property
    def valid(self) -> bool:
        sev = self.findings.column("severity").to_pylist()
        return VIOLATION not in sev


def run_audit(opts: AuditOptions, eng) -> AuditResult:
    """Run every check with ``eng`` (``LocalEngine`` or ``SparkEngine``)."""
    t = {}
    t0 = time.perf_counter()
    replicas = inputs.parse_group_specs(opts.specs, eng.lister)
    files = inventory = inputs.inventory(replicas, eng.lister)
    t["discover_s"] = time.perf_counter() - t0
    out = Findings()

    groups: dict[int, checks.GroupState] = {}
    for r in replicas:
        st = groups.setdefault(r.gid, checks.GroupState(r.gid, r.group, {}))
        st.replicas[r.rid] = checks.ReplicaMeta(r.rid, r.name)
    small = [f for f in inventory if f.kind in (inputs.CHECKPOINT, inputs.HARDSTATE,
                                                 inputs.CQ_CHECKPOINT)]
    t1 = time.perf_counter()
    data = eng.read_small(small)
    for f in small:
        meta = groups[f.gid].replicas[f.rid]
        try:
            value = engine.decode_small(f.kind, data[f.fid])
        except fmt.FormatError as exc:
            out.add("corruption", f"bad_{f.kind}", VIOLATION, gid=f.gid, rid=f.rid, fid=f.fid,
                    detail=f"{f.path}: {exc}")
            continue
        if f.kind == inputs.CHECKPOINT:
            meta.checkpoint = value
        elif f.kind == inputs.HARDSTATE:
            meta.hardstate = value
        else:
            meta.dispatch = value
    for f in inventory:
        if f.kind == inputs.SEGMENT:
            groups[f.gid].replicas[f.rid].segment_starts.append(f.start)
        elif f.kind == inputs.OTHER:
            out.add("corruption", "unknown_file", INFO, gid=f.gid, rid=f.rid, fid=f.fid,
                    detail=f"{f.path} is not part of the format (reported, not read)")
    bulk = [f for f in inventory if f.kind in inputs.BULK_KINDS]
    t["read_small_s"] = time.perf_counter() - t1

    parsed = eng.parse(bulk, opts.max_entry_size)
    t["parse_s"] = parsed.seconds

    t2 = time.perf_counter()
    found = [out.table()]
    ent_by_g = engine.split_by(parsed.entries, ["gid"])
    for gid, st in groups.items():
        e = ent_by_g.get((gid,), parsed.entries.schema.empty_table())
        found.append(checks.check_group(e, st, opts.max_examples, opts.segment_size))
    ent_by_r = engine.split_by(parsed.entries, ["gid", "rid"])
    idx_by_r = engine.split_by(parsed.index, ["gid", "rid"])
    for r in replicas:
        found.append(checks.check_index_files(
            idx_by_r.get((r.gid, r.rid), parsed.index.schema.empty_table()),
            ent_by_r.get((r.gid, r.rid), parsed.entries.schema.empty_table()),
            r.gid, r.rid, opts.max_examples))
    starts = {f.fid: f.start for f in files}
    kinds = {f.fid: f.kind for f in files}
    durable_end = {(g, rid): (m.checkpoint.durable_end if m.checkpoint else 0)
                   for g, st in groups.items() for rid, m in st.replicas.items()}
    found.append(checks.problem_findings(parsed.problems, starts, kinds, durable_end))
    t["log_checks_s"] = time.perf_counter() - t2

    t3 = time.perf_counter()
    ctxs = {}
    for gid, st in groups.items():
        must, log_start = {}, {}
        for rid, m in st.replicas.items():
            bound = min(st.committed, m.agree_end)
            if m.dispatch is not None:
                bound = min(bound, m.dispatch.dispatched_index)
            must[rid] = bound
            log_start[rid] = min(m.segment_starts) if m.segment_starts else 0
        ctxs[gid] = checks.QueueContext(st.committed, must, log_start)
    found.append(eng.queue_findings(ctxs, opts.max_examples))
    t["queue_checks_s"] = time.perf_counter() - t3
    t4 = time.perf_counter()
    sources = {gid: st.sources for gid, st in groups.items()}
    found.append(eng.duplicate_findings(sources, opts.max_examples))
    t["duplicate_checks_s"] = time.perf_counter() - t4

    hstats: dict = {}
    if opts.history:
        t5 = time.perf_counter()
        msgs, nops = history.read_history(opts.history)
        gids = {st.name: gid for gid, st in groups.items()}
        keys = history.history_keys(msgs, gids)
        matched = eng.lookup(keys, sources)
        hf, hstats = history.check_history(msgs, matched, gids, opts.max_examples)
        hstats["ops"] = nops
        found.append(hf)
        t["history_s"] = time.perf_counter() - t5

    counts = dict(parsed.counts)
    counts.update({
        "groups": len(groups), "replicas": len(replicas), "files": len(files),
        "bytes": sum(f.length for f in files),
        "segments": sum(f.kind == inputs.SEGMENT for f in files),
        "segment_bytes": sum(f.length for f in files if f.kind == inputs.SEGMENT),
    })
    by_kind: dict[str, int] = defaultdict(int)
    for f in files:
        by_kind[f.kind] += 1
    counts["files_by_kind"] = dict(by_kind)
    return AuditResult(replicas, files, groups, checks.concat_findings(found), counts, hstats, t)
