"""The audit over replicas that retention cut at different points.

Replicas are written by the product and cut with ``CommitLog.delete_before``
after a snapshot (``retention_replicas``): a replica whose prefix retention
removed is compared over the range it keeps and is not missing data, while a
fault inside the range every replica keeps (a flipped byte, a rewritten
term, a lost middle segment, a wrong ConsumeQueue unit) is still caught, and
so are damaged or missing snapshots.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from commitlog import CommitLog
from spark_audit import cli, fmt
from spark_audit.audit import AuditOptions, run_audit
from spark_audit.engine import LocalEngine

from . import retention_replicas as rr

# Violations each group must show, exactly: (check, kind, replica or "").
EXPECTED: dict[str, set[tuple[str, str, str]]] = {
    "retained": set(),
    "flipped": {("corruption", "body_crc", "n2")},
    # Term 9 at index 70 between entries of term 1: the next entry's term decreases.
    "rewritten": {("divergence", "divergent_entry", "n3"), ("lost_offsets", "term_decrease", "n3"),
                  ("index_validity", "raft_index_mismatch", "n3")},
    "middle_lost": {("lost_offsets", "index_gap", "n2"), ("lost_offsets", "position_gap", "n2"),
                    ("index_validity", "cq_dangling", "n2")},
    "cq_shifted": {("index_validity", "cq_dangling", "n3"),
                   ("index_validity", "cq_not_indexed", "n3"),
                   ("duplicates", "cq_slot_conflict", "")},
    # n2's ConsumeQueues cut at its snapshot's end instead of its log's first
    # position: retained messages lost their units.
    "cq_overcut": {("index_validity", "cq_not_indexed", "n2")},
    "snapshot_damaged": {("corruption", "bad_snapshot_meta", "n2"),
                         ("lost_offsets", "prefix_not_in_snapshot", "n2"),
                         ("corruption", "snapshot_state_crc", "n3"),
                         ("lost_offsets", "prefix_not_in_snapshot", "n3"),
                         ("divergence", "snapshot_log_mismatch", "n1"),
                         ("corruption", "snapshot_state_missing", "n1")},
    "no_snapshot": {("lost_offsets", "prefix_not_in_snapshot", "n3")},
    "prefix_lost": {("lost_offsets", "log_start_mismatch", "n1")},
    "checkpoint_behind": set(),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """ROOT/<group>/<node> for every group of EXPECTED, and the base's messages."""
    tmp = tmp_path_factory.mktemp("retention")
    base = str(tmp / "base")
    msgs = rr.write_base(base)
    root = tmp / "data"
    groups = {name: str(root / name) for name in EXPECTED}
    for name, g in groups.items():
        rr.write_group(base, g, {n: 0 for n in rr.NODES} if name == "cq_overcut" else rr.CUTS)
    n = {name: {node: os.path.join(g, node) for node in rr.NODES} for name, g in groups.items()}
    for node, at in rr.CUTS.items():
        if at:
            rr.cut(n["cq_overcut"][node], at, cq_at=_end(n["cq_overcut"][node], at)
                   if node == "n2" else None)
    rr.flip_body_byte(n["flipped"]["n2"], 60)
    rr.rewrite_term(n["rewritten"]["n3"], 70, 9)
    rr.remove_segment_of(n["middle_lost"]["n2"], 70)
    slot = rr.shift_unit(n["cq_shifted"]["n3"], "orders", 1)
    # n2: its snapshot's meta fails its CRC; n3: its state file changed; n1
    # (whole log) gains a snapshot whose term is not its entry's (re-CRC'd meta).
    meta = os.path.join(rr.snapshot_dir(n["snapshot_damaged"]["n2"]), "meta")
    with open(meta, "r+b") as f:
        f.seek(20)
        f.write(b"\xff")
    with open(os.path.join(rr.snapshot_dir(n["snapshot_damaged"]["n3"]), "state"), "r+b") as f:
        f.write(b"S")
    from .replica_builder import write_snapshot

    write_snapshot(n["snapshot_damaged"]["n1"], 30, 5, _end(n["snapshot_damaged"]["n1"], 30),
                   b"x")
    # n1 also has a meta whose state is gone, n2 a state whose meta was never
    # written (a snapshot write cut short: not a snapshot, information only).
    os.remove(os.path.join(write_snapshot(n["snapshot_damaged"]["n1"], 50, 1,
                                          _end(n["snapshot_damaged"]["n1"], 50), b"y"), "state"))
    os.remove(os.path.join(write_snapshot(n["snapshot_damaged"]["n2"], 60, 1,
                                          _end(n["snapshot_damaged"]["n2"], 60), b"z"), "meta"))
    shutil.rmtree(rr.snapshot_dir(n["no_snapshot"]["n3"]))
    # n1 (whole log): its first segment deleted by hand, the checkpoint still
    # says first_index 1 and no snapshot covers it.
    os.remove(rr.segments(n["prefix_lost"]["n1"])[0])
    # The same, but with a snapshot covering what went: retention deleted the
    # segments and stopped before rewriting the checkpoint.
    gone = rr.segments(n["checkpoint_behind"]["n1"])[:2]
    first_kept = rr.first_entry(rr.segments(n["checkpoint_behind"]["n1"])[2])
    write_snapshot(n["checkpoint_behind"]["n1"], first_kept - 1, 1,
                   int(os.path.basename(rr.segments(n["checkpoint_behind"]["n1"])[2])), b"s")
    for path in gone:
        os.remove(path)
    # n3 of that group: an interrupted install (its marker, a staged file).
    n3 = n["checkpoint_behind"]["n3"]
    open(os.path.join(n3, "INSTALL"), "wb").close()
    os.makedirs(os.path.join(n3, "install.tmp"))
    with open(os.path.join(n3, "install.tmp", "state"), "wb") as f:
        f.write(b"partial")
    return {"root": str(root), "base": base, "msgs": msgs, "tmp": tmp, "slot": slot,
            "nodes": n}


def _end(data_dir: str, index: int) -> int:
    path, off, size = rr.entry_at(data_dir, index)
    return int(os.path.basename(path)) + off + size


@pytest.fixture(scope="module")
def result(built):
    return run_audit(AuditOptions([built["root"]]), LocalEngine())


def violations(res) -> dict[str, set[tuple[str, str, str]]]:
    names = {(r.gid, r.rid): r.name for r in res.replicas}
    groups = {st.gid: st.name for st in res.groups.values()}
    out: dict[str, set[tuple[str, str, str]]] = {g: set() for g in groups.values()}
    for r in res.findings.to_pylist():
        if r["severity"] == "violation":  # gid -1: a history tail row ("further ...")
            out.setdefault(groups.get(r["gid"], ""), set()).add(
                (r["check"], r["kind"], names.get((r["gid"], r["rid"]), "")))
    return out


def group(res, name: str):
    return next(st for st in res.groups.values() if st.name == name)


def kinds(res, name: str, kind: str) -> list[dict]:
    gid = group(res, name).gid
    return [r for r in res.findings.to_pylist() if r["gid"] == gid and r["kind"] == kind]


def test_each_group_reports_exactly_its_faults(result):
    got = violations(result)
    wrong = {name: got[name] for name, want in EXPECTED.items() if got[name] != want}
    assert not wrong


def test_cut_replicas_are_compared_over_what_they_keep(result):
    st = group(result, "retained")
    n1, n2, n3 = (st.replicas[r] for r in sorted(st.replicas))
    assert n1.first_index == 1 and not n1.trimmed
    assert n2.trimmed and n3.trimmed and 1 < n2.first_index < n3.first_index
    assert n1.last_index == n2.last_index == n3.last_index == rr.ENTRIES
    # Every node agrees with the group from where its own log starts to the end,
    # so the replica that lost most of its prefix is checked like the others.
    assert [(m.agree_start, m.agree_end) for m in (n1, n2, n3)] == [
        (1, rr.ENTRIES), (n2.first_index, rr.ENTRIES), (n3.first_index, rr.ENTRIES)]
    assert (st.first_index, st.committed) == (1, rr.ENTRIES)
    assert (st.shared_first, st.shared_last) == (n3.first_index, rr.ENTRIES)
    assert (st.retained_first, st.retained_from) == (1, 0)
    # n1 alone holds the prefix the others cut: the committed log is still read
    # from it (n2 and n3 vouch for it by having cut it), so nothing is lost.
    assert st.sources == [(1, rr.ENTRIES, 0)]
    assert not kinds(result, "retained", "under_replicated")
    # Index records left below the first entry are not "beyond the log".
    assert not kinds(result, "retained", "raft_index_beyond_log")


def test_retained_ranges_are_in_the_summary(built, tmp_path, capsys):
    out = str(tmp_path / "out")
    g = os.path.join(built["root"], "retained")
    assert cli.main([g, "--engine", "python", "--out", out]) == 0
    printed = capsys.readouterr().out
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    (grp,) = summary["groups"]
    reps = {r["replica"]: r for r in summary["replicas"]}
    segs = {n: rr.segments(os.path.join(g, n)) for n in rr.NODES}
    for node, r in reps.items():
        assert r["segments"] == len(segs[node])
        assert r["first_position"] == int(os.path.basename(segs[node][0]))
        assert r["last_index"] == rr.ENTRIES and r["end_position"] > r["last_position"]
        assert r["prefix_removed"] == (node != "n1")
        assert r["snapshot_index"] == (rr.CUTS[node] or None)
    assert (grp["shared_first_index"], grp["shared_last_index"]) == (
        reps["n3"]["first_index"], rr.ENTRIES)
    assert (grp["retained_first_index"], grp["retained_from_position"]) == (1, 0)
    with open(os.path.join(out, "report.html")) as f:
        assert f"{reps['n3']['first_index']}..{rr.ENTRIES}" in f.read()
    assert (f"group retained: committed {rr.ENTRIES}, shared {reps['n3']['first_index']}.."
            f"{rr.ENTRIES}; n1 1..{rr.ENTRIES}, n2 {reps['n2']['first_index']}..") in printed


def test_faults_point_where_they_are(built, result):
    (crc,) = kinds(result, "flipped", "body_crc")
    path, off, _ = rr.entry_at(built["nodes"]["flipped"]["n2"], 60)
    assert (result.files[crc["fid"]].path, crc["file_offset"], crc["index"]) == (path, off, 60)
    (div,) = kinds(result, "rewritten", "divergent_entry")
    assert (div["index"], div["count"]) == (70, 1)
    gap = kinds(result, "middle_lost", "index_gap")
    assert [r["rid"] for r in gap] == [1]
    # A lost middle segment still stops n2's agreement there.
    st = group(result, "middle_lost")
    assert st.replicas[1].agree_end < 70 <= st.replicas[2].agree_end
    (bad,) = kinds(result, "snapshot_damaged", "snapshot_log_mismatch")
    assert (bad["rid"], bad["index"]) == (0, 30)
    (unfinished,) = kinds(result, "snapshot_damaged", "snapshot_unfinished")
    assert (unfinished["severity"], unfinished["rid"], unfinished["index"]) == ("info", 1, 60)
    (mismatch,) = kinds(result, "prefix_lost", "log_start_mismatch")
    assert mismatch["rid"] == 0
    (behind,) = kinds(result, "checkpoint_behind", "retention_checkpoint_behind")
    assert behind["severity"] == "info" and behind["rid"] == 0
    assert group(result, "checkpoint_behind").replicas[0].trimmed
    (pending,) = kinds(result, "checkpoint_behind", "install_pending")
    assert (pending["severity"], pending["rid"]) == ("info", 2)
    assert not kinds(result, "checkpoint_behind", "unknown_file")


def _history(path: str, group: str, msgs, read: set[int], phantom: int | None = None) -> None:
    ops = []
    for k, (_index, seq, off) in enumerate(msgs):
        v = {"topic": "orders", "queue": 0, "producer_id": rr.PRODUCER, "sequence": seq,
             "msg_id": f"{group}@{off:016X}", "group": group}
        ops.append({"index": 2 * k, "time_ns": k, "process": 1, "type": "ok", "f": "send",
                    "value": v})
        if seq in read:
            ops.append({"index": 2 * k + 1, "time_ns": k, "process": 2, "type": "ok",
                        "f": "poll", "value": v})
    if phantom is not None:
        ops.append({"index": 10**6, "time_ns": 0, "process": 1, "type": "ok", "f": "send",
                    "value": {"topic": "orders", "queue": 0, "producer_id": 77, "sequence": 1,
                              "msg_id": f"{group}@{phantom:016X}", "group": group}})
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(o) for o in ops) + "\n")


def test_acked_messages_below_every_replica_are_outside_retention(built):
    """Every node cut: what no replica keeps is counted apart, never valid, never lost."""
    tmp = built["tmp"]
    g = rr.write_group(built["base"], str(tmp / "hist" / "cut"), {"n1": 15, "n2": 25,
                                                                   "n3": 45})
    firsts = [rr.first_entry(rr.segments(os.path.join(g, n))[0]) for n in rr.NODES]
    floor_pos = int(os.path.basename(rr.segments(os.path.join(g, "n1"))[0]))
    below = [m for m in built["msgs"] if m[2] < floor_pos]
    assert below and min(firsts) == below[-1][0] + 1
    read = {seq for _, seq, _ in below[::2]} | {built["msgs"][-1][1]}
    ok = str(tmp / "hist" / "ok.jsonl")
    _history(ok, "cut", built["msgs"], read)
    res = run_audit(AuditOptions([g], [ok]), LocalEngine())
    assert res.valid, violations(res)
    h = res.history_stats
    assert h["acked_sends"] == len(built["msgs"])
    assert h["acked_outside_retention"] == len(below)
    assert h["acked_outside_retention_read"] == len(below[::2])
    assert h["consumed_outside_retention"] == len(below[::2])
    assert h["acked_missing"] == 0 and h["consumed_missing"] == 0
    info = [r for r in res.findings.to_pylist() if r["kind"] == "acked_send_outside_retention"]
    assert info and {r["severity"] for r in info} == {"info"}
    assert sum(r["count"] for r in info) == len(below)
    assert group(res, "cut").retained_from == floor_pos
    # A message acknowledged inside the retained range and absent is still lost.
    bad = str(tmp / "hist" / "bad.jsonl")
    _history(bad, "cut", built["msgs"], read, phantom=floor_pos + 7)
    res = run_audit(AuditOptions([g], [bad]), LocalEngine())
    assert violations(res)["cut"] == {("history", "acked_send_missing", "")}


def test_history_without_retention_is_unchanged(built):
    """On the whole log nothing is outside retention: a missing ack is lost."""
    tmp = built["tmp"]
    g = rr.write_group(built["base"], str(tmp / "hist2" / "whole"), dict.fromkeys(rr.NODES, 0))
    path = str(tmp / "hist2" / "h.jsonl")
    _history(path, "whole", built["msgs"], set(), phantom=1)
    res = run_audit(AuditOptions([g], [path]), LocalEngine())
    assert violations(res)["whole"] == {("history", "acked_send_missing", "")}
    assert res.history_stats["acked_outside_retention"] == 0


def test_a_replica_that_lost_its_start_keeps_the_messages_lost(built):
    """n1's first segment went without its checkpoint's consent: what it held
    there is lost, not outside retention, although no replica holds it now."""
    g = os.path.join(built["root"], "prefix_lost")
    gone = int(os.path.basename(rr.segments(os.path.join(g, "n1"))[0]))
    lost = [m for m in built["msgs"] if m[2] < gone]
    path = str(built["tmp"] / "lost.jsonl")
    _history(path, "prefix_lost", built["msgs"], {seq for _, seq, _ in lost})
    res = run_audit(AuditOptions([g], [path]), LocalEngine())
    assert group(res, "prefix_lost").retained_from == 0
    assert ("history", "acked_send_missing", "") in violations(res)["prefix_lost"]
    h = res.history_stats
    assert (h["acked_missing"], h["consumed_missing"]) == (len(lost), len(lost))
    assert h["acked_outside_retention"] == 0


@pytest.mark.spark
def test_spark_finds_the_same_over_cut_replicas(spark, built, result):
    """On local Spark: the same faults, and exactly the in-process findings (snapshot
    state files are read by Spark tasks too)."""
    from spark_audit.spark_engine import SparkEngine

    res = run_audit(AuditOptions([built["root"]]), SparkEngine(spark))
    got = violations(res)
    assert {name: got[name] for name in EXPECTED} == EXPECTED
    key = ["check", "kind", "severity", "gid", "rid", "fid", "file_offset", "index", "slot",
           "phys_offset", "count"]
    assert sorted(res.findings.select(key).to_pylist(), key=repr) == sorted(
        result.findings.select(key).to_pylist(), key=repr)
    assert res.counts["files_by_kind"]["snapshot_state"] == result.counts["files_by_kind"][
        "snapshot_state"] > 0


def test_snapshots_the_product_writes_are_read(built):
    """Metas written by ``commitlog.snapshot`` decode with the audit's parser and
    cover the cut they allowed (runs once the storage's snapshot module exists)."""
    product = pytest.importorskip("commitlog.snapshot")
    g = str(built["tmp"] / "product" / "g")
    rr.write_group(built["base"], g, dict.fromkeys(rr.NODES, 0))
    infos = {}
    for node, at in (("n2", 30), ("n3", 50)):
        d = os.path.join(g, node)
        log = CommitLog.open(d, rr.CONFIG)
        try:
            infos[node] = product.write_snapshot(d, at, log.term_at(at), log.entry_end(at),
                                                 b"broker state %d" % at)
        finally:
            log.close()
        rr.cut(d, at, snapshot=False)
    res = run_audit(AuditOptions([g]), LocalEngine())
    assert res.valid, violations(res)
    st = group(res, "g")
    for rid, node in ((1, "n2"), (2, "n3")):
        m = st.replicas[rid]
        (snap,) = m.snapshots.values()
        info = infos[node]
        assert snap.meta == fmt.SnapshotMeta(info.index, info.term, info.end_position,
                                             info.created_ms, info.state_bytes, info.state_crc)
        assert m.trimmed and m.first_index - 1 <= info.index


def test_the_distributed_audit_finds_the_same_over_cut_replicas(built, result):
    """The distributed passes (in this process): every row, details included, and each
    group's ranges are the in-process engine's."""
    from spark_audit.engine import LocalFlowEngine

    res = run_audit(AuditOptions([built["root"]]), LocalFlowEngine())
    key = ["check", "kind", "severity", "gid", "rid", "fid", "file_offset", "index", "topic",
           "queue_id", "slot", "phys_offset", "count", "detail"]
    assert sorted(res.findings.select(key).to_pylist(), key=repr) == sorted(
        result.findings.select(key).to_pylist(), key=repr)
    for gid, st in res.groups.items():
        other = result.groups[gid]
        assert (st.committed, st.shared_first, st.shared_last, st.retained_first,
                st.retained_from, st.retained_away, st.sources) == (
            other.committed, other.shared_first, other.shared_last, other.retained_first,
            other.retained_from, other.retained_away, other.sources)
