"""The nightly, incremental audit: ``ledgermq audit --nightly --state DIR``.

A night, per group (``DIR/manifest/<group>.json``, ``manifest``):

1. the first index each replica keeps on disk (one entry header per
   replica); spans of the manifest below all of them were deleted by
   retention: dropped (``rotation.trim``), never reported as lost;
2. the new range, from the index after the last one verified to the cut
   (``--cut``) or, without one, to the files' committed index: audited as
   the window ``[T, cut]`` (``window``; T, the last entry verified the night
   before, is read again so that continuity across nights is checked), and
   digested per replica in spans (``digest``);
3. the rolling re-verification (``rotation.select``): the stalest spans, at
   least ``ceil(V / N)`` indexes and everything verified ``N`` nights ago,
   audited as one window per contiguous block, each replica's digest of each
   span compared with the manifest's: a difference is ``digest_mismatch``
   (a consistent rewrite on every replica with recomputed CRCs passes every
   cross-replica check; only this catches it); a span no replica holds any
   more is dropped when the audit explains it as retention
   (``retained_away``), else ``verified_range_lost``;
4. when the group passed, the manifest is written back (new spans, the
   re-verified ones stamped, retention's drops); a failed night changes
   nothing, so the next one reports the failure again.

Groups share runs: one run audits every group's new window (``runs/new``),
one run each group's k-th re-verification window (``runs/reverify-k``).
Then ``DIR/nights/<night>/night.json`` (the schema in docs/audit.md),
``DIR/latest.json``, the cross-night outputs (``trend``, when installed)
and one summary line on stdout; exit 0 passed, 1 a check failed, 2 the
inputs (or the state) could not be read.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.util
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_audit import digest, fmt, inputs, manifest, retained, rotation, session, window
from spark_audit.audit import AuditOptions
from spark_audit.checks import VIOLATION
from spark_audit.engine import Engine, LocalEngine
from spark_audit.manifest import Manifest, Part, Span
from spark_audit.prepare import check_sizes
from spark_audit.runs import Outcome, audit_to

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = 1
DEFAULT_NIGHTS = 7
DIGEST_MISMATCH, RANGE_LOST = "digest_mismatch", "verified_range_lost"


@dataclass
class NightOptions:
    specs: list[str]
    state_dir: str
    rolling_nights: int = DEFAULT_NIGHTS
    cuts: dict[str, int] = field(default_factory=dict)
    engine: str = "spark"
    master: str = session.DEFAULT_MASTER
    driver_memory: str = session.DEFAULT_DRIVER_MEMORY
    progress: bool = True
    max_entry_size: int = fmt.DEFAULT_MAX_ENTRY_SIZE
    segment_size: int = 0
    max_examples: int = 20
    block: int = digest.DEFAULT_BLOCK  # a new manifest's digest block
    # The manifests' HMAC key (``manifest`` module); None: plain SHA-256 seals.
    manifest_key: bytes | None = None


class NightError(Exception):
    """The night cannot run (state locked or unreadable, inputs unreadable): exit 2."""


@dataclass
class Plan:
    """One group's night, before the runs."""

    name: str
    roots: list[tuple[str, str]]  # (replica name, data directory)
    manifest: Manifest
    firsts: dict[str, int]  # replica -> first index on disk (1: unknown; 0: no log)
    floor: int
    spans: list[Span]  # the manifest's spans after retention's drops (parts rebased)
    dropped: list[rotation.Range]
    tonight: int
    reverify: list[Span]
    windows: list[rotation.Range]
    new_window: window.Bounds | None
    cut: int  # --cut, 0 for none


@dataclass
class Tally:
    """What the runs found about one group."""

    findings: dict[tuple[Any, ...], tuple[str, int]] = field(default_factory=dict)
    extra: list[dict[str, Any]] = field(default_factory=list)  # digest findings
    entries: int = 0
    bytes: int = 0
    runs: list[str] = field(default_factory=list)
    committed: int | None = None  # the new run's committed index
    claimed: int = 0
    replicas: dict[str, dict[str, int]] = field(default_factory=dict)
    new_spans: list[Span] = field(default_factory=list)
    checked: dict[tuple[int, int], Span] = field(default_factory=dict)  # re-verified spans
    gone: list[rotation.Range] = field(default_factory=list)  # retained away since
    new: rotation.Range | None = None
    deletions: list[tuple[int, str]] = field(default_factory=list)  # the new run's

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for kind, n in self.findings.values():
            out[kind] += n
        for x in self.extra:
            out[x["kind"]] += 1
        return dict(out)


def night_id(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


@contextlib.contextmanager
def _locked(state_dir: str) -> Iterator[None]:
    os.makedirs(state_dir, exist_ok=True)
    fd = os.open(os.path.join(state_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise NightError(f"another nightly audit holds {state_dir}/.lock") from None
        yield
    finally:
        os.close(fd)


def _start(state_dir: str) -> tuple[str, float]:
    """A night id no earlier night has (ids are UTC seconds: wait for the next one)."""
    while True:
        t = time.time()
        nid = night_id(t)
        if not os.path.exists(os.path.join(state_dir, "nights", nid)):
            return nid, t
        time.sleep(1.0 - t % 1.0 + 0.01)


# --------------------------------------------------------------------- planning


def plan_group(name: str, roots: list[tuple[str, str]], m: Manifest, firsts: dict[str, int],
               opts: NightOptions) -> Plan:
    """Retention's drops, the spans to re-verify and the new window of one group."""
    held = [f for f in firsts.values() if f]
    # No replica holds anything: nothing is kept (a failed night changes nothing).
    floor = min(held) if held else manifest.MAX_INDEX
    kept, dropped = rotation.trim([rotation.Aged(s.lo, s.hi, s.night_no) for s in m.spans],
                                  floor)
    by_hi = {s.hi: s for s in m.spans}
    spans = []
    for a in kept:
        s = by_hi[a.hi]
        # A replica whose retention cut into the span (or past it) holds another part
        # than was recorded: its digest is rebased at the span's next re-verification.
        parts = {r: p for r, p in s.replicas.items()
                 if p.lo >= a.lo and 0 < firsts.get(r, 1) <= p.lo}
        spans.append(s.model_copy(update={"lo": a.lo, "replicas": parts}))
    tonight = m.nights + 1
    chosen = rotation.select([rotation.Aged(s.lo, s.hi, s.night_no) for s in spans], tonight,
                             opts.rolling_nights)
    picked = {(a.lo, a.hi) for a in chosen}
    reverify = [s for s in spans if (s.lo, s.hi) in picked]
    cut = opts.cuts.get(name, 0)
    t = m.verified_through
    new = None if cut and cut <= t else window.Bounds(max(1, t), cut)
    return Plan(name, roots, m, firsts, floor, spans, dropped, tonight, reverify,
                rotation.windows(chosen), new, cut)


def _discover(opts: NightOptions, eng: Engine
              ) -> tuple[dict[str, list[tuple[str, str]]], dict[str, dict[str, int]]]:
    """Groups (replica names and directories) and each replica's first index on disk."""
    reps = inputs.parse_group_specs(opts.specs, eng.lister)
    files = inputs.inventory(reps, eng.lister)
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    firsts: dict[str, dict[str, int]] = defaultdict(dict)
    for r in reps:
        groups[r.group].append((r.name, r.root))
        log = window.ReplicaLog(eng, [f for f in files if (f.gid, f.rid) == (r.gid, r.rid)],
                                opts.max_entry_size)
        first = log.first()
        # Unknown (a damaged first segment): count it as holding everything.
        firsts[r.group][r.name] = first[0] if first else (1 if log.segs else 0)
    return dict(groups), dict(firsts)


# ------------------------------------------------------------------------- runs


def _spec(p: Plan) -> str:
    return f"{p.name}=" + ",".join(root for _, root in p.roots)


def _run(opts: NightOptions, night_dir: str, name: str, plans: list[Plan],
         bounds: dict[str, window.Bounds], plans_digest: dict[str, digest.Plan],
         spark: SparkSession | None) -> Outcome:
    known = {p.name: [(d.index, d.topic) for d in p.manifest.deletions] for p in plans}
    ao = AuditOptions([_spec(p) for p in plans], [], opts.max_entry_size, opts.segment_size,
                      opts.max_examples, True, bounds, plans_digest, known)
    return audit_to(ao, os.path.join(night_dir, "runs", name), engine=opts.engine,
                    master=opts.master, driver_memory=opts.driver_memory,
                    progress=opts.progress, spark=spark)


def _tally_run(tally: dict[str, Tally], out: Outcome, run: str) -> None:
    """Each group's findings (violations, deduplicated across runs), sizes and run."""
    res = out.result
    assert res is not None and out.summary is not None
    names = {st.gid: st.name for st in res.groups.values()}
    reps = {(r.gid, r.rid): r.name for r in res.replicas}
    paths = {f.fid: f.path for f in res.files}
    for row in res.findings.to_pylist():
        if row["severity"] != VIOLATION:
            continue
        # Findings about what every run reads the same way (small files, the log's
        # start) come once per run: counted once.
        key = (row["check"], row["kind"], reps.get((row["gid"], row["rid"]), ""),
               paths.get(row["fid"], ""), row["file_offset"], row["index"], row["topic"],
               row["queue_id"], row["slot"], row["phys_offset"], row["detail"])
        g = names.get(row["gid"])
        if g is None:  # not about one group (none in a nightly run): the first group's
            g = sorted(names.values())[0]
        tally[g].findings[key] = (row["kind"], int(row["count"]))
    for st in res.groups.values():
        t = tally[st.name]
        t.runs.append(f"runs/{run}")
        t.entries += sum(m.entries for m in st.replicas.values())
        t.bytes += sum(f.length for f in res.files if f.gid == st.gid)


def _parts(st: Any, got: dict[int, tuple[int, str]], lo: int, hi: int,
           firsts: dict[str, int]) -> dict[str, tuple[int, int, str, bool]]:
    """Per replica name: (part start, entries, digest, complete) of span lo..hi, for the
    replicas holding part of it. Complete: it holds every index of its part, agreeing
    with the group there (only complete parts are recorded)."""
    out = {}
    for rid, m in st.replicas.items():
        first = firsts.get(m.name, 1)
        part = max(lo, first)
        if not first or part > hi:
            continue
        n, hx = got.get(rid, (0, digest.EMPTY))
        complete = (n == hi - part + 1 and m.agree_start <= part and m.agree_end >= hi)
        out[m.name] = (part, n, hx, complete)
    return out


def _evaluate_new(p: Plan, t: Tally, out: Outcome, stamp: tuple[str, int, float]) -> None:
    res = out.result
    assert res is not None and out.summary is not None
    st = next(s for s in res.groups.values() if s.name == p.name)
    t.committed, t.claimed = st.committed, st.claimed_commit
    t.new = rotation.new_range(p.manifest.verified_through, p.floor, st.committed)
    t.deletions = res.deletions.get(st.gid, [])
    night, no, when = stamp
    for (lo, hi), got in sorted(res.digests.get(st.gid, {}).items()):
        if hi > st.committed:
            continue  # not committed (the night fails then: under_replicated)
        parts = {r: Part(lo=a, entries=n, digest=hx)
                 for r, (a, n, hx, ok) in _parts(st, got, lo, hi, p.firsts).items() if ok}
        t.new_spans.append(Span(lo=lo, hi=hi, night=night, night_no=no, verified=when,
                                replicas=parts))


def _evaluate_reverify(p: Plan, t: Tally, out: Outcome, spans: list[Span],
                       stamp: tuple[str, int, float]) -> None:
    """Compare each re-read span's digests with the manifest's."""
    res = out.result
    assert res is not None
    st = next(s for s in res.groups.values() if s.name == p.name)
    got_all = res.digests.get(st.gid, {})
    away = [(g.lo, g.hi) for g in st.retained_away]
    night, no, when = stamp
    for s in spans:
        now = _parts(st, got_all.get((s.lo, s.hi), {}), s.lo, s.hi, p.firsts)
        parts: dict[str, Part] = {}
        for r, (a, n, hx, ok) in now.items():
            rec = s.replicas.get(r)
            if rec is not None and rec.lo == a:
                if (rec.entries, rec.digest) != (n, hx):
                    t.extra.append({
                        "kind": DIGEST_MISMATCH, "group": p.name, "replica": r,
                        "range": [a, s.hi], "recorded": {"entries": rec.entries,
                                                         "digest": rec.digest,
                                                         "night": s.night},
                        "found": {"entries": n, "digest": hx},
                        "detail": f"replica {r} of group {p.name}: entries {a}..{s.hi} "
                                  f"differ from what night {s.night} verified ({rec.entries} "
                                  f"entries, digest {rec.digest}; now {n}, {hx})"})
                parts[r] = rec
            elif ok:
                parts[r] = Part(lo=a, entries=n, digest=hx)  # rebased (retention cut it)
        if not any(n for _, n, _, _ in now.values()):
            # No replica holds any of it: retention's (retained away) or lost.
            if not retained.outside_spans(s.lo, s.hi, away):
                t.gone.append((s.lo, s.hi))
                continue
            t.extra.append({"kind": RANGE_LOST, "group": p.name, "replica": "",
                            "range": [s.lo, s.hi],
                            "detail": f"group {p.name}: indexes {s.lo}..{s.hi}, verified by "
                                      f"night {s.night}, are on no replica and retention does "
                                      "not explain it"})
            continue
        t.checked[(s.lo, s.hi)] = Span(lo=s.lo, hi=s.hi, night=night, night_no=no,
                                       verified=when, replicas=parts)


def _replicas(summary: dict[str, Any], group: str) -> dict[str, dict[str, int]]:
    return {r["replica"]: {"agree_end": int(r["agree_end"]), "lag": int(r["lag"]),
                           "last_index": int(r["last_index"])}
            for r in summary["replicas"] if r["group"] == group}


# ---------------------------------------------------------------------- the night


def run_night(opts: NightOptions) -> int:
    """One night; prints its summary line and returns the exit status."""
    if opts.rolling_nights < 1:
        print("audit night: --rolling-nights must be at least 1", file=sys.stderr)
        return 2
    try:
        check_sizes(opts.max_entry_size, opts.segment_size)
    except ValueError as exc:
        print(f"audit night: {exc}", file=sys.stderr)
        return 2
    try:
        with _locked(opts.state_dir):
            return _night(opts)
    except NightError as exc:
        print(f"audit night ERROR: {exc}")
        return 2


def _night(opts: NightOptions) -> int:
    nid, started = _start(opts.state_dir)
    night_dir = os.path.join(opts.state_dir, "nights", nid)
    os.makedirs(night_dir)
    spark = None
    master = opts.master if opts.engine == "spark" else "in-process"
    plans: list[Plan] = []
    error = ""
    try:
        eng: Engine = LocalEngine()
        if opts.engine == "spark":
            from spark_audit.spark_engine import SparkEngine

            try:
                spark = session.get_session(opts.master, driver_memory=opts.driver_memory,
                                            progress=opts.progress)
            except Exception as exc:  # no JVM, a master that does not answer: say so
                raise ValueError(f"cannot start Spark ({opts.master}): {exc}") from None
            eng = SparkEngine(spark)
        groups, firsts = _discover(opts, eng)
        unknown = sorted(set(opts.cuts) - set(groups))
        if unknown:
            raise ValueError(f"--cut names group(s) {', '.join(unknown)}, not among "
                             f"{', '.join(sorted(groups))}")
        for name in sorted(groups):
            m = (manifest.load(opts.state_dir, name, opts.manifest_key)
                 or manifest.empty(name, opts.block))
            plans.append(plan_group(name, groups[name], m, firsts[name], opts))
    except (ValueError, OSError) as exc:  # ManifestError is a ValueError
        error, plans = str(exc), []
    tally = {p.name: Tally() for p in plans}
    tonight_time = time.time()
    if not error:
        error = _runs(opts, night_dir, plans, tally, spark, nid, tonight_time)
    finished = time.time()
    code = 2 if error else (1 if any(t.kinds() for t in tally.values()) else 0)
    dropped: dict[str, list[rotation.Range]] = {}
    for p in plans:
        t = tally[p.name]
        if code != 2 and not t.kinds():
            dropped[p.name] = retained.join_spans(p.dropped + t.gone)
            p.manifest = _updated(p, t)
            manifest.save(opts.state_dir, p.manifest, opts.manifest_key)
    doc = _night_doc(opts, nid, started, finished, code, master, plans, tally, dropped)
    if tally and any(t.extra for t in tally.values()):
        manifest.write_atomic(os.path.join(night_dir, "digests.json"), json.dumps(
            [x for t in tally.values() for x in t.extra], indent=1).encode() + b"\n")
        for t in tally.values():
            for x in t.extra:
                print(f"audit night {nid}: {x['kind']}: {x['detail']}", file=sys.stderr)
    data = json.dumps(doc, indent=1).encode() + b"\n"
    manifest.write_atomic(os.path.join(night_dir, "night.json"), data)
    manifest.write_atomic(os.path.join(opts.state_dir, "latest.json"), data)
    trend_error = _trend(opts.state_dir)
    if error:
        print(f"audit night {nid} ERROR: {error}")
    else:
        print(summary_line(doc))
    if trend_error:
        print(f"audit night {nid}: {trend_error}", file=sys.stderr)
        return max(code, 2)
    return code


def _runs(opts: NightOptions, night_dir: str, plans: list[Plan], tally: dict[str, Tally],
          spark: SparkSession | None, nid: str, when: float) -> str:
    """Every run of the night; the error that stopped it ("" for none)."""
    new = [p for p in plans if p.new_window is not None]
    if new:
        out = _run(opts, night_dir, "new", new, {p.name: p.new_window for p in new
                                                  if p.new_window is not None},
                   {p.name: digest.Plan(open_from=p.manifest.verified_through + 1,
                                        block=p.manifest.block) for p in new}, spark)
        if out.result is None:
            return out.error
        _tally_run(tally, out, "new")
        for p in new:
            _evaluate_new(p, tally[p.name], out, (nid, p.tonight, when))
            tally[p.name].replicas = _replicas(out.summary or {}, p.name)
    for k in range(max((len(p.windows) for p in plans), default=0)):
        mine = [p for p in plans if k < len(p.windows)]
        bounds = {p.name: window.Bounds(*p.windows[k]) for p in mine}
        spans = {p.name: [s for s in p.reverify if p.windows[k][0] <= s.lo <= p.windows[k][1]]
                 for p in mine}
        run = f"reverify-{k + 1}"
        out = _run(opts, night_dir, run, mine, bounds,
                   {p.name: digest.Plan(spans=tuple((s.lo, s.hi) for s in spans[p.name]))
                    for p in mine}, spark)
        if out.result is None:
            return out.error
        _tally_run(tally, out, run)
        for p in mine:
            _evaluate_reverify(p, tally[p.name], out, spans[p.name], (nid, p.tonight, when))
            if not tally[p.name].replicas:
                tally[p.name].replicas = _replicas(out.summary or {}, p.name)
    return ""


def _updated(p: Plan, t: Tally) -> Manifest:
    """The group's manifest after a night it passed."""
    gone = t.gone
    spans = [t.checked.get((s.lo, s.hi), s) for s in p.spans
             if not any(a <= s.lo and s.hi <= b for a, b in gone)]
    spans += [s for s in t.new_spans if s.lo > p.manifest.verified_through]
    spans.sort(key=lambda s: s.lo)
    through = max(p.manifest.verified_through, t.committed or 0)
    known = {(d.index, d.topic) for d in p.manifest.deletions} | set(t.deletions)
    # Deletions below what any replica keeps are retention's: no window reads there.
    deletions = [manifest.Deletion(index=i, topic=topic) for i, topic in sorted(known)
                 if i >= p.floor]
    return p.manifest.model_copy(update={"spans": spans, "nights": p.tonight,
                                         "verified_through": through,
                                         "deletions": deletions})


def _night_doc(opts: NightOptions, nid: str, started: float, finished: float, code: int,
               master: str, plans: list[Plan], tally: dict[str, Tally],
               dropped: dict[str, list[rotation.Range]]) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {}
    for p in plans:
        t = tally[p.name]
        kinds = t.kinds()
        m = p.manifest
        times = [s.verified for s in m.spans]
        groups[p.name] = {
            "cut": p.cut or (t.committed if t.committed is not None
                             else m.verified_through),
            "cut_source": "admin" if p.cut else "files",
            "new": list(t.new) if t.new else None,
            "reverified": [list(w) for w in p.windows],
            "dropped": [list(d) for d in dropped.get(p.name, [])],
            "verified_through": m.verified_through,
            "oldest_verification": min(times) if times else None,
            "entries_audited": t.entries, "bytes_audited": t.bytes,
            "violations": sum(kinds.values()), "findings": kinds,
            "replicas": t.replicas, "runs": t.runs,
        }
    findings: dict[str, int] = defaultdict(int)
    for g in groups.values():
        for k, n in g["findings"].items():
            findings[k] += n
    return {
        "format": FORMAT, "night": nid, "started": started, "finished": finished,
        "duration_s": round(finished - started, 3), "valid": code == 0, "exit": code,
        "engine": opts.engine, "master": master,
        "entries_audited": sum(g["entries_audited"] for g in groups.values()),
        "bytes_audited": sum(g["bytes_audited"] for g in groups.values()),
        "violations": sum(findings.values()), "findings": dict(findings), "groups": groups,
    }


def _ranges(rs: list[list[int]]) -> str:
    return ", ".join(f"{a}..{b}" for a, b in rs)


def summary_line(doc: dict[str, Any]) -> str:
    """The one line for cron and CI."""
    parts = []
    for name, g in sorted(doc["groups"].items()):
        bits = [f"new {g['new'][0]}..{g['new'][1]}" if g["new"] else "nothing new"]
        if g["reverified"]:
            bits.append(f"re-verified {_ranges(g['reverified'])}")
        if g["dropped"]:
            bits.append(f"dropped {_ranges(g['dropped'])}")
        parts.append((name, ", ".join(bits)))
    what = parts[0][1] if len(parts) == 1 else "; ".join(f"{n}: {b}" for n, b in parts)
    verdict = "PASSED" if doc["valid"] else "FAILED"
    n = len(doc["groups"])
    head = f"audit night {doc['night']} {verdict}: "
    if not doc["valid"]:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(doc["findings"].items()))
        head += f"{doc['violations']:,} violations ({kinds}) in "
    return (f"{head}{n} group{'s' if n != 1 else ''}, {doc['entries_audited']:,} entries "
            f"({what}) in {doc['duration_s']:.1f} s")


def _trend(state_dir: str) -> str:
    """The cross-night outputs (index.html, audit.prom) by ``spark_audit.trend``, when
    this build has it; an error message when writing them failed ("" otherwise)."""
    if importlib.util.find_spec("spark_audit.trend") is None:
        # A build without the results module: night.json and latest.json are the outputs.
        print("note: spark_audit.trend is not installed: index.html and audit.prom are not "
              "written", file=sys.stderr)
        return ""
    try:
        trend = importlib.import_module("spark_audit.trend")
        trend.write_outputs(state_dir)
    except Exception as exc:  # the night's verdict is written: say why it went wrong
        return f"the cross-night outputs (index.html, audit.prom) failed: {exc!r}"
    return ""
