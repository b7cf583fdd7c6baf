"""The audit on a real local SparkSession: same findings as in-process, outputs, exit status."""

from __future__ import annotations

import json
import os

import pytest

from spark_audit import cli
from spark_audit.audit import AuditOptions, run_audit
from spark_audit.engine import LocalEngine
from spark_audit.spark_engine import SparkEngine

from . import scenarios

pytestmark = pytest.mark.spark

EXPECTED = {
    "clean": set(),
    "divergent_term": {("divergence", "divergent_entry")},
    "truncated": {("lost_offsets", "committed_entries_missing")},
    "duplicated": {("duplicates", "duplicate_client_id")},
    "cq_wrong_position": {("index_validity", "cq_not_indexed"), ("duplicates", "indexed_twice")},
    "flipped_byte": {("corruption", "body_crc")},
    "uncommitted_tail": set(),
    "under_replicated": {("lost_offsets", "under_replicated")},
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """One root holding a group per scenario, plus histories for the clean group."""
    root = tmp_path_factory.mktemp("audit")
    layouts = {name: make(str(root / "data" / name)) for name, make in
               scenarios.SCENARIOS.items()}
    scenarios.write_history(str(root / "bad.jsonl"), "clean", layouts["clean"]["n1"], True)
    return root


def by_group(res) -> dict[str, set[tuple[str, str]]]:
    names = {st.gid: st.name for st in res.groups.values()}
    out: dict[str, set] = {n: set() for n in names.values()}
    for r in res.findings.to_pylist():
        if r["severity"] == "violation":
            out[names.get(r["gid"], "")].add((r["check"], r["kind"]))
    return out


def test_spark_catches_every_fault_like_the_local_engine(spark, data):
    opts = AuditOptions([str(data / "data")], [str(data / "bad.jsonl")])
    res = run_audit(opts, SparkEngine(spark))
    got = by_group(res)
    for name, want in EXPECTED.items():
        assert want <= got[name], (name, got[name])
    assert got["uncommitted_tail"] == set()
    assert got["clean"] == {("history", "acked_send_missing")}
    # The distributed run finds exactly what the in-process run finds.
    local = run_audit(opts, LocalEngine())
    key = ["check", "kind", "severity", "gid", "rid", "index", "slot", "phys_offset", "count"]
    assert sorted(res.findings.select(key).to_pylist(), key=repr) == sorted(
        local.findings.select(key).to_pylist(), key=repr)
    assert res.counts["messages"] == local.counts["messages"] > 0


def test_spark_cli_clean_group_passes_and_faulty_fails(spark, data, tmp_path):
    clean = ",".join(str(data / "data" / "clean" / n) for n in scenarios.NODES)
    rc = cli.run([f"clean={clean}"], out=str(tmp_path / "ok"), spark=spark, progress=False)
    assert rc == 0
    summary = json.loads((tmp_path / "ok" / "summary.json").read_text())
    assert summary["valid"] and summary["engine"] == "spark"
    assert summary["inputs"]["entries"] == 3 * 120
    rc = cli.run([str(data / "data" / "flipped_byte")], out=str(tmp_path / "bad"), spark=spark)
    assert rc == 1
    summary = json.loads((tmp_path / "bad" / "summary.json").read_text())
    ex = summary["checks"]["corruption"]["kinds"]["body_crc"]["examples"][0]
    assert ex["replica"] == "n2" and ex["file"].endswith(os.path.join("n2", "commitlog",
                                                                       ex["file"][-20:]))
    assert os.path.exists(tmp_path / "bad" / "findings.parquet")


def test_binary_file_source_gives_the_same_results(spark, data, monkeypatch):
    """Remote URIs are read by Spark's binaryFile source instead of by the tasks:
    forced here on local files, the per-file results are the same."""
    from spark_audit import inputs, tasks

    reps = inputs.parse_group_specs([str(data / "data" / "flipped_byte")])
    files = [f for f in inputs.inventory(reps) if f.kind in inputs.BULK_KINDS]
    mode = {inputs.SEGMENT: tasks.SCAN_MSGS, inputs.INDEX: tasks.INDEX,
            inputs.CQ: tasks.CQ_UNITS}
    todo = [tasks.FileTask(i, f, mode[f.kind]) for i, f in enumerate(files)]
    eng = SparkEngine(spark)
    local = sorted(eng.run_tasks(todo, 1 << 26), key=lambda r: r.tid)
    monkeypatch.setattr(inputs, "is_local", lambda path: False)
    remote = sorted(eng.run_tasks(todo, 1 << 26), key=lambda r: r.tid)
    assert [r.tid for r in remote] == list(range(len(todo)))
    for a, b in zip(local, remote, strict=True):
        for name in ("entries", "messages", "index", "units"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or (x == y).all(), name
        assert (a.problems, a.msg_problems, a.crc, a.length) == (
            b.problems, b.msg_problems, b.crc, b.length)
    assert any(p[2] == "body_crc" for r in remote for p in r.problems)
