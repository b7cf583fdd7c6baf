"""The audit's checks through the in-process engine: each injected fault is caught."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark_audit import cli, runs
from spark_audit.audit import AuditOptions, run_audit
from spark_audit.engine import LocalEngine

from . import scenarios
from .replica_builder import Msg, flip_byte, make_log, write_replica


def audit(root: str, history: list[str] | None = None):
    return run_audit(AuditOptions([root], history or []), LocalEngine())


def violations(res) -> set[tuple[str, str, str]]:
    """(check, kind, replica name) of every violation."""
    names = {(r.gid, r.rid): r.name for r in res.replicas}
    return {(r["check"], r["kind"], names.get((r["gid"], r["rid"]), ""))
            for r in res.findings.to_pylist() if r["severity"] == "violation"}


def rows(res, kind: str) -> list[dict]:
    return [r for r in res.findings.to_pylist() if r["kind"] == kind]


def test_clean_replicas_pass(tmp_path):
    lay = scenarios.clean(str(tmp_path / "g1"))
    res = audit(str(tmp_path / "g1"))
    assert res.valid, res.findings.to_pylist()
    assert res.counts["entries"] == 3 * 120
    assert res.counts["messages"] == 3 * 480
    assert res.counts["cq"] == 3 * 480
    assert res.counts["segments"] == 3 * len({p.segment for p in lay["n1"].entries})
    st = res.groups[0]
    assert (st.committed, st.quorum_end, st.segment_size) == (120, 120, scenarios.SEGMENT)
    assert st.sources == [(1, 120, 0)]


def test_rewritten_term_is_a_divergence_at_that_index(tmp_path):
    scenarios.divergent_term(str(tmp_path / "g"))
    res = audit(str(tmp_path / "g"))
    assert not res.valid
    (row,) = rows(res, "divergent_entry")
    assert (row["rid"], row["index"], row["severity"]) == (1, 40, "violation")
    assert res.groups[0].replicas[1].first_divergent == 40
    assert res.groups[0].committed == 120  # n1 and n3 still form a quorum


def test_truncated_replica_has_lost_committed_entries(tmp_path):
    scenarios.truncated(str(tmp_path / "g"))
    res = audit(str(tmp_path / "g"))
    v = violations(res)
    assert ("lost_offsets", "committed_entries_missing", "n3") in v
    assert ("lost_offsets", "durable_entries_missing", "n3") in v
    (row,) = rows(res, "committed_entries_missing")
    assert (row["index"], row["count"]) == (91, 30)


def test_duplicated_message_is_reported_once_per_identity(tmp_path):
    lay = scenarios.duplicated(str(tmp_path / "g"))
    res = audit(str(tmp_path / "g"))
    assert violations(res) == {("duplicates", "duplicate_client_id", "")}
    (row,) = rows(res, "duplicate_client_id")
    assert row["index"] == 60
    assert row["phys_offset"] == lay["n1"].entry(60).messages[-1][2]


def test_cq_unit_pointing_at_wrong_position(tmp_path):
    scenarios.cq_wrong_position(str(tmp_path / "g"))
    res = audit(str(tmp_path / "g"))
    v = violations(res)
    # Slot 5 now repeats slot 6's offset: not increasing, indexed twice, and the
    # message of slot 5 has lost its unit; the other replicas disagree on slot 5.
    assert ("index_validity", "cq_out_of_order", "n1") in v
    assert ("duplicates", "indexed_twice", "n1") in v
    assert ("index_validity", "cq_not_indexed", "n1") in v
    assert ("duplicates", "cq_slot_conflict", "") in v
    assert {r["slot"] for r in rows(res, "cq_slot_conflict")} == {5}


def test_cq_unit_pointing_between_messages_is_dangling(tmp_path):
    lay = scenarios.clean(str(tmp_path / "g"))
    off = lay["n2"].units[("orders", 0)][3][1]
    from .replica_builder import set_cq_unit_offset

    set_cq_unit_offset(lay["n2"], "orders", 0, 3, off + 1, scenarios.UNITS)
    res = audit(str(tmp_path / "g"))
    (row,) = rows(res, "cq_dangling")
    assert (row["rid"], row["slot"], row["phys_offset"]) == (1, 3, off + 1)


def test_flipped_byte_is_a_crc_error_with_file_and_offset(tmp_path):
    lay = scenarios.flipped_byte(str(tmp_path / "g"))
    res = audit(str(tmp_path / "g"))
    (row,) = rows(res, "body_crc")
    p = lay["n2"].entry(33)
    assert (row["check"], row["rid"], row["index"]) == ("corruption", 1, 33)
    assert row["file_offset"] == p.position - p.segment
    assert res.files[row["fid"]].path.endswith(f"n2/commitlog/{p.segment:020d}")
    assert violations(res) == {("corruption", "body_crc", "n2")}


def test_flipped_header_byte_is_caught_and_parsing_resumes(tmp_path):
    lay = scenarios.clean(str(tmp_path / "g"))
    p = lay["n1"].entry(50)
    flip_byte(lay["n1"].segment_path(p.segment), p.position - p.segment + 26)  # term
    res = audit(str(tmp_path / "g"))
    (row,) = rows(res, "header_crc")
    assert row["file_offset"] == p.position - p.segment
    # Entry 50 is unreadable on n1, entry 51 is parsed again: an index gap.
    gap = rows(res, "index_gap")
    assert [(r["rid"], r["index"]) for r in gap] == [(0, 51)]


def test_uncommitted_divergence_is_information_only(tmp_path):
    scenarios.uncommitted_tail(str(tmp_path / "g"))
    res = audit(str(tmp_path / "g"))
    assert res.valid, violations(res)
    (row,) = rows(res, "uncommitted_divergence")
    assert (row["rid"], row["index"], row["severity"]) == (2, 101, "info")


def test_commit_beyond_quorum_is_under_replication(tmp_path):
    scenarios.under_replicated(str(tmp_path / "g"))
    res = audit(str(tmp_path / "g"))
    (row,) = rows(res, "under_replicated")
    assert (row["index"], row["count"]) == (101, 20)
    assert res.groups[0].committed == 100


def test_torn_tail_after_durable_point_is_information(tmp_path):
    root = str(tmp_path / "g")
    log = make_log(scenarios.batches(30))
    lay = {}
    for n in scenarios.NODES:
        lay[n] = write_replica(os.path.join(root, n), log, segment_size=scenarios.SEGMENT,
                               durable_index=29, commit=29, dispatched_index=29)
    p = lay["n1"].entry(30)
    with open(lay["n1"].segment_path(p.segment), "r+b") as f:
        f.truncate(p.position - p.segment + 100)
    res = audit(root)
    (row,) = rows(res, "torn_tail")
    assert row["severity"] == "info" and row["rid"] == 0
    assert res.valid, violations(res)


def test_history_acked_message_missing_from_log(tmp_path):
    lay = scenarios.clean(str(tmp_path / "g1"))
    good = str(tmp_path / "ok.jsonl")
    bad = str(tmp_path / "bad.jsonl")
    scenarios.write_history(good, "g1", lay["n1"], missing=False)
    scenarios.write_history(bad, "g1", lay["n1"], missing=True)
    res = audit(str(tmp_path / "g1"), [good])
    assert res.valid, violations(res)
    assert res.history_stats["acked_sends"] == 480 and res.history_stats["consumed"] == 480
    res = audit(str(tmp_path / "g1"), [bad])
    assert violations(res) == {("history", "acked_send_missing", "")}
    assert res.history_stats["acked_missing"] == 1


def test_history_consumed_message_must_exist(tmp_path):
    scenarios.clean(str(tmp_path / "g1"))
    path = str(tmp_path / "h.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"index": 1, "time_ns": 5, "process": 3, "type": "ok", "f": "poll",
                            "value": {"messages": [{"topic": "orders", "queue": 1,
                                                    "msg_id": "g1@00000000000FFFFF",
                                                    "offset": 3}]}}) + "\n")
    res = audit(str(tmp_path / "g1"), [path])
    assert violations(res) == {("history", "consumed_missing", "")}


def test_noop_and_control_entries_are_accepted(tmp_path):
    from spark_audit import fmt

    from .replica_builder import Entry

    log = make_log(scenarios.batches(10))
    log.append(Entry(11, 2, fmt.KIND_NOOP))
    log.append(Entry(12, 2, fmt.KIND_CONTROL, body=b"\x81\xa1k\xa1v"))
    log.append(Entry(13, 2, fmt.KIND_MESSAGES, [Msg("orders", 0, b"z")]))
    scenarios.write_group(str(tmp_path / "g"), log)
    res = audit(str(tmp_path / "g"))
    assert res.valid, violations(res)
    assert res.counts["entries"] == 3 * 13


def test_cli_writes_outputs_and_exit_status(tmp_path):
    scenarios.divergent_term(str(tmp_path / "data" / "bad"))
    scenarios.clean(str(tmp_path / "data2" / "good"))
    out = str(tmp_path / "out")
    rc = cli.main([str(tmp_path / "data"), "--engine", "python", "--out", out])
    assert rc == 1
    summary = json.loads(Path(out, "summary.json").read_text())
    assert summary["valid"] is False
    assert summary["checks"]["divergence"]["valid"] is False
    assert summary["checks"]["corruption"]["valid"] is True
    assert summary["inputs"]["replicas"] == 3
    ex = summary["checks"]["divergence"]["kinds"]["divergent_entry"]["examples"][0]
    assert (ex["group"], ex["replica"], ex["index"]) == ("bad", "n2", 40)
    findings = pq.read_table(os.path.join(out, "findings.parquet"))
    assert "divergent_entry" in findings.column("kind").to_pylist()
    assert "<img" in Path(out, "report.html").read_text()
    assert cli.main([f"good={tmp_path}/data2/good/n1,{tmp_path}/data2/good/n2,"
                     f"{tmp_path}/data2/good/n3", "--engine", "python", "--out", out]) == 0


@pytest.mark.parametrize("spec", ["missing-dir", "g=/nonexistent/a"])
def test_unreadable_inputs_exit_2(tmp_path, spec):
    arg = str(tmp_path / spec) if spec == "missing-dir" else spec
    assert cli.main([arg, "--engine", "python", "--out", str(tmp_path / "o")]) == 2


@pytest.mark.parametrize("case", ["missing-dir", "empty-dir", "named", "history"])
def test_missing_local_inputs_are_refused_before_spark_starts(tmp_path, monkeypatch, capsys,
                                                              case):
    """`ledgermq audit /nonexistent` used to start a SparkSession (seconds) and
    only then say that the directory does not exist."""
    def no_spark(*args, **kwargs):
        raise AssertionError("a SparkSession was started for inputs that do not exist")

    monkeypatch.setattr(runs.session, "get_session", no_spark)
    data = tmp_path / "data"
    scenarios.SCENARIOS["clean"](str(data / "good"))
    (tmp_path / "empty-dir").mkdir()
    args = {"missing-dir": [str(tmp_path / "missing-dir")],
            "empty-dir": [str(tmp_path / "empty-dir")],
            "named": [f"g={data}/good/n1,{tmp_path}/nonexistent"],
            "history": [str(data), "--history", str(tmp_path / "no.jsonl")]}[case]
    assert cli.main([*args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("audit: cannot read the inputs: ")
    assert {"missing-dir": "missing-dir: no such directory",
            "empty-dir": "empty-dir: no such directory",
            "named": f"{tmp_path}/nonexistent is missing or empty",
            "history": "no.jsonl: no such history file"}[case] in err


def test_remote_inputs_are_left_to_the_engine_to_list():
    """Only the engine's lister can list a remote file system: no verdict here."""
    assert runs.local_inputs_missing(AuditOptions(["hdfs://nn:8020/nightly/g"])) == ""
    assert runs.local_inputs_missing(AuditOptions(["g=/data/n1,s3a://bucket/n2"])) == ""


def test_sharing_between_identical_replicas_changes_no_finding(tmp_path):
    """Decoding one replica and sharing its records and ConsumeQueue checks with
    identical replicas finds exactly what decoding and checking each does."""
    for name, make in scenarios.SCENARIOS.items():
        make(str(tmp_path / "data" / name))
    key = ["check", "kind", "severity", "gid", "rid", "fid", "file_offset", "index", "topic",
           "queue_id", "slot", "phys_offset", "count"]
    shared = run_audit(AuditOptions([str(tmp_path / "data")]), LocalEngine())
    alone = run_audit(AuditOptions([str(tmp_path / "data")], share_identical=False),
                      LocalEngine())
    rows = [r for r in shared.findings.select(key).to_pylist()
            if r["kind"] != "cq_same_as_reference"]
    assert sorted(rows, key=repr) == sorted(alone.findings.select(key).to_pylist(), key=repr)
    assert shared.counts["messages"] == alone.counts["messages"]
    # Sharing decoded far fewer records: about one replica's per group.
    assert shared.counts["messages_decoded"] < alone.counts["messages_decoded"] / 2
    assert "cq_same_as_reference" in shared.findings.column("kind").to_pylist()


def test_counts_over_two_groups(tmp_path):
    scenarios.clean(str(tmp_path / "root" / "g1"), 30)
    scenarios.clean(str(tmp_path / "root" / "g2"), 20)
    res = audit(str(tmp_path / "root"))
    assert res.valid, violations(res)
    assert res.counts["entries"] == 3 * 50 and res.counts["messages"] == 3 * 4 * 50
    # One replica per group decoded; identical ConsumeQueue files decoded once.
    assert res.counts["messages_decoded"] == 4 * 50
    assert res.counts["cq_units_decoded"] == 4 * 50
    assert res.counts["decode_tasks"] == 0


def _linked_kinds(tmp_path: Path, link) -> tuple[int, dict]:
    """Audit a clean 3-replica group after `link(group_dir)` (python engine):
    the exit status and the summary."""
    group = tmp_path / "data" / "g"
    scenarios.SCENARIOS["clean"](str(group))
    link(group)
    out = str(tmp_path / "out")
    rc = cli.main([str(tmp_path / "data"), "--engine", "python", "--out", out])
    return rc, json.loads(Path(out, "summary.json").read_text())


def _segment(replica: Path) -> Path:
    return sorted((replica / "commitlog").iterdir())[0]


@pytest.mark.parametrize("how", ["symlink", "hardlink", "linked_dir"])
def test_replicas_sharing_a_file_are_reported(tmp_path, how):
    """A replica whose segment is another replica's file (a link) looked
    like a perfect copy: the audit passed, yet one disk's loss would lose both."""
    def link(group: Path) -> None:
        mine, theirs = _segment(group / "n3"), _segment(group / "n1")
        if how == "linked_dir":
            shutil.rmtree(group / "n3" / "commitlog")
            (group / "n3" / "commitlog").symlink_to(group / "n1" / "commitlog")
            return
        mine.unlink()
        if how == "symlink":
            mine.symlink_to(theirs)
        else:
            os.link(theirs, mine)

    rc, summary = _linked_kinds(tmp_path, link)
    assert rc == 1
    shared = summary["checks"]["corruption"]["kinds"]["shared_file"]
    # One finding per linked file: the segment, or every file of the linked directory.
    if how == "linked_dir":
        assert shared["count"] >= 1
    else:
        assert shared["count"] == 1
    for example in shared["examples"]:
        assert "/n3/commitlog/" in example["detail"]
        assert "is the same file as" in example["detail"] and "/n1/commitlog/" in example["detail"]


def test_a_link_loop_inside_a_replica_is_walked_once(tmp_path):
    """A link back to the replica's root used to list its files again at every
    level until the kernel's ELOOP stopped the whole audit (exit 2)."""
    clean_rc, clean = _linked_kinds(tmp_path / "a", lambda group: None)
    rc, summary = _linked_kinds(
        tmp_path / "b", lambda group: (group / "n1" / "consumequeue" / "loop").symlink_to(".."))
    assert (clean_rc, rc) == (0, 0)
    # Every file counted once, as without the loop.
    assert summary["inputs"]["files"] == clean["inputs"]["files"]
    assert summary["inputs"]["messages"] == clean["inputs"]["messages"]


def test_a_commitlog_moved_to_another_disk_by_a_link_is_a_replica_of_its_own(tmp_path):
    """The operator's layout: a replica's `commitlog/` linked to a directory
    elsewhere (another disk) is not sharing."""
    def move(group: Path) -> None:
        elsewhere = tmp_path / "disk2" / "n2-commitlog"
        elsewhere.parent.mkdir()
        shutil.move(str(group / "n2" / "commitlog"), str(elsewhere))
        (group / "n2" / "commitlog").symlink_to(elsewhere)

    rc, summary = _linked_kinds(tmp_path, move)
    assert rc == 0
    assert "shared_file" not in summary["checks"]["corruption"].get("kinds", {})
