"""Committed entries that retention removed from the replicas holding them.

What the chaos matrix with retention left: a replica that stayed down (its
log ends at X, or was damaged there) while the others' retention deleted past
its end (their first index F > X + 1), and a replica still holding entries
the others deleted. Replicas are written by the product and cut with
``CommitLog.delete_before`` after a snapshot (``retention_replicas``), and the
histories carry the body digests the chaos workload records. Entries X+1..F-1
were committed and are covered by the live replicas' snapshots: retained
away (info), their acknowledged messages outside retention. What retention
cannot explain stays a fault: a gap no majority of snapshots covers, a lost
segment of the stopped replica, its damaged entries and truncated tail.
"""

from __future__ import annotations

import json
import os
import shutil

import crc32c
import pytest

from spark_audit import cli, fmt
from spark_audit.audit import AuditOptions, run_audit
from spark_audit.engine import LocalEngine

from . import retention_replicas as rr

STOPPED = 50  # the stopped replica's log ends here
FIRST = {"n1": 20, "n2": 70, "n3": 70}  # snapshot index each node's retention cut at


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("retained-away")
    full, short = str(tmp / "full"), str(tmp / "short")
    msgs = rr.write_base(full)
    rr.write_base(short, STOPPED)
    return {"tmp": tmp, "full": full, "short": short, "msgs": msgs}


def _stopped_group(bases: dict, name: str) -> str:
    """n1 stopped at STOPPED and cut at 20; n2 and n3 went on and cut at 70."""
    own = {"n1": bases["short"], "n2": bases["full"], "n3": bases["full"]}
    return rr.write_group(own, str(bases["tmp"] / name / name), FIRST)


def _history(bases: dict, group: str, read_every: int = 2) -> str:
    """Every message acknowledged, with the body digest the chaos workload records;
    every ``read_every``-th one consumed too."""
    path = str(bases["tmp"] / f"{group}.jsonl")
    with open(path, "w") as f:
        for k, (_index, seq, off) in enumerate(bases["msgs"]):
            v = {"topic": "orders", "queue": 0, "producer_id": rr.PRODUCER, "sequence": seq,
                 "msg_id": f"{group}@{off:016X}", "group": group,
                 "body_crc32c": crc32c.crc32c(rr.body_of(seq))}
            f.write(json.dumps({"index": 2 * k, "time_ns": k, "process": 1, "type": "ok",
                                "f": "send", "value": v}) + "\n")
            if k % read_every == 0:
                f.write(json.dumps({"index": 2 * k + 1, "time_ns": k, "process": 2,
                                    "type": "ok", "f": "poll", "value": v}) + "\n")
    return path


def _audit(bases: dict, g: str):
    name = os.path.basename(g)
    # Every history finding listed, to see which messages each names.
    return run_audit(AuditOptions([g], [_history(bases, name)], max_examples=10_000),
                     LocalEngine())


def violations(res) -> set[tuple[str, str, str]]:
    names = {(r.gid, r.rid): r.name for r in res.replicas}
    return {(r["check"], r["kind"], names.get((r["gid"], r["rid"]), ""))
            for r in res.findings.to_pylist() if r["severity"] == "violation"}


def kinds(res, kind: str) -> list[dict]:
    return [r for r in res.findings.to_pylist() if r["kind"] == kind]


def _first_position(g: str, node: str) -> int:
    return int(os.path.basename(rr.segments(os.path.join(g, node))[0]))


def _end(data_dir: str, index: int) -> int:
    path, off, size = rr.entry_at(data_dir, index)
    return int(os.path.basename(path)) + off + size


def _position(data_dir: str, index: int) -> int:
    path, off, _ = rr.entry_at(data_dir, index)
    return int(os.path.basename(path)) + off


def test_entries_a_stale_replica_still_holds_are_not_under_replicated(bases):
    """n3 keeps entries n1 and n2 deleted (their snapshots cover them): with the
    history's body digests confirming n3's copies, those are committed and held
    by a majority counting n1 and n2, not under-replicated."""
    g = rr.write_group(bases["full"], str(bases["tmp"] / "stale" / "stale"),
                       {"n1": 45, "n2": 45, "n3": 25})
    res = _audit(bases, g)
    assert violations(res) == set()
    (st,) = res.groups.values()
    n3 = st.replicas[2]
    assert n3.first_index < st.replicas[0].first_index
    assert (st.first_index, st.committed) == (n3.first_index, rr.ENTRIES)
    assert st.sources == [(n3.first_index, rr.ENTRIES, 2)]
    assert not kinds(res, "retained_away")
    h = res.history_stats
    below = [m for m in bases["msgs"] if m[0] < n3.first_index]
    assert (h["acked_missing"], h["acked_outside_retention"]) == (0, len(below))


def test_entries_between_a_stopped_replica_and_the_others_are_retained_away(bases):
    """n1 stopped at 50; n2 and n3 went on and deleted up to 70: entries 51..70
    were committed and removed by retention, not lost."""
    g = _stopped_group(bases, "stopped")
    res = _audit(bases, g)
    assert violations(res) == set()
    (st,) = res.groups.values()
    n1, n2 = (os.path.join(g, n) for n in ("n1", "n2"))
    f1, f2 = st.replicas[0].first_index, st.replicas[1].first_index
    assert st.replicas[0].last_index == STOPPED < f2 - 1
    assert (st.committed, st.shared_first, st.shared_last) == (rr.ENTRIES, 0, 0)
    # The committed log is read from n1 up to its end, then from n2.
    assert st.sources == [(f1, STOPPED, 0), (f2, rr.ENTRIES, 1)]
    (away,) = kinds(res, "retained_away")
    assert (away["severity"], away["check"], away["index"], away["count"]) == (
        "info", "lost_offsets", STOPPED + 1, f2 - STOPPED - 1)
    assert away["phys_offset"] == _end(n1, STOPPED)
    assert f"{STOPPED + 1}..{f2 - 1}" in away["detail"] and "n2, n3" in away["detail"]
    (gap,) = st.retained_away
    assert (gap.pos_lo, gap.pos_hi) == (_end(n1, STOPPED), _position(n2, f2))
    # Acknowledged messages there are outside retention, like those below every log.
    floor = _first_position(g, "n1")
    outside = [m for m in bases["msgs"] if m[2] < floor or STOPPED < m[0] < f2]
    h = res.history_stats
    assert (h["acked_missing"], h["consumed_missing"]) == (0, 0)
    assert h["acked_outside_retention"] == len(outside)
    assert h["acked_outside_retention_read"] == len([
        k for k, m in enumerate(bases["msgs"]) if m in outside and k % 2 == 0])
    in_gap = {m[2] for m in outside if m[2] >= floor}
    info = kinds(res, "acked_send_outside_retention")
    assert {r["phys_offset"] for r in info if "removed from every replica" in r["detail"]
            } == in_gap


def test_the_cli_reports_retained_away_ranges(bases, tmp_path, capsys):
    g = _stopped_group(bases, "cli")
    f2 = rr.first_entry(rr.segments(os.path.join(g, "n2"))[0])
    out = str(tmp_path / "out")
    assert cli.main([os.path.dirname(g), "--engine", "python", "--out", out]) == 0
    printed = capsys.readouterr().out
    with open(os.path.join(out, "summary.json")) as f:
        (grp,) = json.load(f)["groups"]
    (away,) = grp["retained_away"]
    assert (away["first_index"], away["last_index"], away["removed_by"]) == (
        STOPPED + 1, f2 - 1, ["n2", "n3"])
    assert f"; retained away {STOPPED + 1}..{f2 - 1}" in printed
    with open(os.path.join(out, "report.html")) as f:
        assert f"{STOPPED + 1}..{f2 - 1}" in f.read()


def test_a_stopped_replica_s_own_damage_is_still_reported(bases):
    """n1's file truncated inside entry 45 (its checkpoint says 50 are durable),
    another of its entries with a flipped body byte: its own faults, and only
    those; the entries after its end are retained away with the rest."""
    g = _stopped_group(bases, "damaged")
    n1 = os.path.join(g, "n1")
    rr.flip_body_byte(n1, 30)
    rr.cut_segment_inside(n1, 45)
    res = _audit(bases, g)
    assert violations(res) == {
        ("corruption", "body_crc", "n1"), ("history", "body_mismatch", "n1"),
        ("corruption", "torn_tail", "n1"),
        ("lost_offsets", "durable_entries_missing", "n1"),
        ("lost_offsets", "committed_entries_missing", "n1"),
        ("index_validity", "cq_dangling", "n1")}
    (st,) = res.groups.values()
    assert st.committed == rr.ENTRIES
    (away,) = kinds(res, "retained_away")
    assert (away["index"], away["count"]) == (45, st.replicas[1].first_index - 45)
    # The flipped entry is n1's damage inside what it still holds: not excused.
    assert [(r["index"], r["rid"]) for r in kinds(res, "body_crc")] == [(30, 0)]
    h = res.history_stats
    assert (h["acked_missing"], h["consumed_missing"]) == (0, 0)


def test_a_damaged_copy_past_the_durable_point_holds_nothing(bases):
    """n1's checkpoint says 45 are durable (its log goes on to 50, not yet
    synced) and entry 48 has a flipped body byte: what a crash may leave
    (torn_tail, info). That copy is not the committed entry, so 48 counts as
    retained away like 51.. (n2 and n3 cover it); the body that differs from
    the one sent is still reported."""
    g = _stopped_group(bases, "torn")
    n1 = os.path.join(g, "n1")
    with open(os.path.join(n1, "checkpoint"), "rb") as f:
        cp = fmt.parse_checkpoint(f.read())
    with open(os.path.join(n1, "checkpoint"), "wb") as f:
        f.write(fmt.encode_checkpoint(fmt.Checkpoint(45, _end(n1, 45), 1, cp.first_index)))
    rr.flip_body_byte(n1, 48)
    res = _audit(bases, g)
    assert violations(res) == {("history", "body_mismatch", "n1")}
    (torn,) = kinds(res, "torn_tail")
    assert (torn["severity"], torn["index"]) == ("info", 48)
    (st,) = res.groups.values()
    assert [(gap.lo, gap.hi) for gap in st.retained_away] == [
        (48, 48), (STOPPED + 1, st.replicas[1].first_index - 1)]
    assert st.committed == rr.ENTRIES
    assert res.history_stats["acked_missing"] == 0
    # Without a history nothing refutes that copy: its failed body CRC alone
    # keeps it from standing for the committed entry.
    res = run_audit(AuditOptions([g]), LocalEngine())
    assert violations(res) == set()
    (st,) = res.groups.values()
    assert [(gap.lo, gap.hi) for gap in st.retained_away] == [
        (48, 48), (STOPPED + 1, st.replicas[1].first_index - 1)]


def test_a_gap_without_a_majority_of_snapshots_is_lost(bases):
    """n3's snapshot is gone: only n2's covers 51..70, fewer than a majority, so
    the gap stays under-replicated and its acknowledged messages missing."""
    g = _stopped_group(bases, "unvouched")
    shutil.rmtree(rr.snapshot_dir(os.path.join(g, "n3")))
    res = _audit(bases, g)
    got = violations(res)
    assert {("lost_offsets", "prefix_not_in_snapshot", "n3"),
            ("lost_offsets", "under_replicated", ""),
            ("history", "acked_send_missing", "")} <= got
    assert not kinds(res, "retained_away")
    (st,) = res.groups.values()
    (under,) = kinds(res, "under_replicated")
    assert under["index"] == STOPPED + 1 == st.quorum_end + 1
    gap = [m for m in bases["msgs"] if STOPPED < m[0] < st.replicas[1].first_index]
    assert res.history_stats["acked_missing"] >= len(gap)


def test_a_segment_lost_by_the_stopped_replica_is_lost(bases):
    """n1 (cut at 15, whole to the end) lost a middle segment that n2 and n3
    deleted by retention: n1 should still hold it, so its messages are missing,
    not outside retention, while the group's committed log goes on."""
    g = rr.write_group(bases["full"], str(bases["tmp"] / "hole" / "hole"),
                       {"n1": 15, "n2": 70, "n3": 70})
    n1 = os.path.join(g, "n1")
    lost = rr.remove_segment_of(n1, 40)
    lo = int(os.path.basename(lost))
    hi = lo + rr.CONFIG.segment_size_bytes
    res = _audit(bases, g)
    assert violations(res) == {
        ("lost_offsets", "index_gap", "n1"), ("lost_offsets", "position_gap", "n1"),
        ("index_validity", "cq_dangling", "n1"), ("history", "acked_send_missing", ""),
        ("history", "consumed_missing", "")}
    assert not kinds(res, "retained_away") and not kinds(res, "under_replicated")
    (st,) = res.groups.values()
    assert st.committed == rr.ENTRIES
    gone = [k for k, m in enumerate(bases["msgs"]) if lo <= m[2] < hi]
    h = res.history_stats
    assert gone and (h["acked_missing"], h["consumed_missing"]) == (
        len(gone), len([k for k in gone if k % 2 == 0]))
    # Entries after the hole are still read from n1, the only replica holding them.
    (_, b, r1), (c, d, r2) = st.sources
    assert (r1, r2, d) == (0, 0, rr.ENTRIES) and b < 40 < c < st.replicas[1].first_index


def test_a_segment_lost_everywhere_is_still_lost(bases):
    """No retention explains a middle segment every replica lost."""
    g = rr.write_group(bases["full"], str(bases["tmp"] / "everywhere" / "everywhere"),
                       {"n1": 0, "n2": 25, "n3": 45})
    for node in rr.NODES:
        rr.remove_segment_of(os.path.join(g, node), 70)
    res = _audit(bases, g)
    got = violations(res)
    assert {("lost_offsets", "under_replicated", ""), ("history", "acked_send_missing", "")
            } <= got
    assert {(c, k, n) for c, k, n in got if n} >= {
        ("lost_offsets", "index_gap", n) for n in rr.NODES}
    assert not kinds(res, "retained_away")


def _same_both_ways(bases: dict, name: str, engine, damaged: bool) -> tuple:
    """The stopped group (n1 damaged where it keeps entries, when ``damaged``) audited in
    process and with ``engine``: the same rows and the same one retained-away range.
    Returns both results (in process first)."""
    g = _stopped_group(bases, name)
    if damaged:
        n1 = os.path.join(g, "n1")
        rr.flip_body_byte(n1, 30)
        rr.cut_segment_inside(n1, 45)
    opts = AuditOptions([g], [_history(bases, name)], max_examples=10_000)
    local, res = run_audit(opts, LocalEngine()), run_audit(opts, engine)
    key = ["check", "kind", "severity", "gid", "rid", "fid", "file_offset", "index", "slot",
           "phys_offset", "count", "detail"]
    assert sorted(res.findings.select(key).to_pylist(), key=repr) == sorted(
        local.findings.select(key).to_pylist(), key=repr)
    (st,), (lst,) = res.groups.values(), local.groups.values()
    assert st.retained_away == lst.retained_away and len(st.retained_away) == 1
    return local, res


@pytest.mark.spark
def test_spark_finds_the_same_across_a_retained_away_gap(spark, bases):
    """On local Spark: the stopped, damaged replica group gives exactly the
    in-process findings and the same retained-away range."""
    from spark_audit.spark_engine import SparkEngine

    _same_both_ways(bases, "spark", SparkEngine(spark), damaged=True)


@pytest.mark.parametrize("damage", ["none", "stopped_replica_damaged"])
def test_the_distributed_audit_finds_the_same_across_a_gap(bases, damage):
    """The distributed passes (in this process) give the in-process rows and ranges."""
    from spark_audit.engine import LocalFlowEngine

    local, res = _same_both_ways(bases, f"flow_{damage}", LocalFlowEngine(),
                                 damaged=damage != "none")
    assert res.history_stats == local.history_stats
