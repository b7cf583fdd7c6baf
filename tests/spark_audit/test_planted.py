"""The planted-corruption suite (``spark_audit.planted``) on a real run's replicas.

The base is tests/fixtures/real-run-3n.tar.gz: three brokers' data
directories and the client history of a real run (recorded by
``bench/audit_corruption.py --record``). The clean copy must audit with no
violation; every planted case must produce exactly its expected violations
(no miss, nothing overstated) and point at the planted file and offset. The
in-process engine runs every case; one Spark session runs representative
ones and must find exactly the same.
"""

from __future__ import annotations

import json

import pytest

from spark_audit import cli, planted
from spark_audit.engine import LocalEngine
from tests.chaos.histories import REAL_RUN

SPARK_CASES = ("majority_rewrite", "hardstate_term_max", "entry_index_max", "cq_offset_max",
               "zeroed_page", "entries_swapped_renumbered")
KEY = ["check", "kind", "severity", "gid", "rid", "fid", "file_offset", "index", "slot",
       "phys_offset", "count"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return planted.unpack_base(REAL_RUN, tmp_path_factory.mktemp("planted") / "base")


def test_the_clean_copy_has_no_violation(base, tmp_path) -> None:
    got = planted.audit_case(base, tmp_path / "clean", None)
    assert got["ok"] and got["found"] == [], got
    res = got["_result"]
    # Only the info that identical replicas were validated once, and that the
    # recorded directories predate IDENTITY files (the identity cases write them).
    assert {r["kind"] for r in res.findings.to_pylist()} == {"cq_same_as_reference",
                                                              "no_identity"}
    assert res.history_stats["acked_sends"] == res.history_stats["body_digests"] > 300


def test_the_suite_has_every_required_kind_of_case() -> None:
    assert len(planted.CASES) >= 25


@pytest.mark.parametrize("name", list(planted.CASES))
def test_each_planted_case_is_found_exactly(base, tmp_path, name) -> None:
    got = planted.audit_case(base, tmp_path / name, planted.CASES[name], LocalEngine())
    got.pop("_result")
    assert got["ok"], json.dumps(got, indent=1)


def test_a_majority_rewrite_is_blamed_on_the_rewritten_replicas(base, tmp_path) -> None:
    got = planted.audit_case(base, tmp_path / "m", planted.CASES["majority_rewrite"])
    res = got["_result"]
    names = {(r.gid, r.rid): r.name for r in res.replicas}
    blamed = {names[(r["gid"], r["rid"])] for r in res.findings.to_pylist()
              if r["severity"] == "violation" and r["rid"] >= 0}
    assert blamed == {"n2", "n3"}
    # The committed messages are read from the healthy replica: nothing acked is missing.
    assert res.history_stats["acked_missing"] == 0
    assert res.groups[0].committed == res.groups[0].claimed_commit


def test_an_extreme_hard_state_term_is_a_finding_not_a_crash(base, tmp_path) -> None:
    work = tmp_path / "hs"
    import shutil

    shutil.copytree(base, work)
    planted.hardstate_term_max(work / "data" / planted.GROUP)
    rc = cli.run([str(work / "data")], out=str(tmp_path / "out"), engine="python",
                 history=[str(work / "history.jsonl")])
    assert rc == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    kinds = summary["checks"]["corruption"]["kinds"]
    assert list(kinds) == ["implausible_value"]
    assert "18446744073709551615" in kinds["implausible_value"]["examples"][0]["detail"]
    assert [r["hardstate_term"] for r in summary["replicas"]] == [None, 2, 2]


@pytest.mark.spark
def test_spark_finds_what_the_local_engine_finds(spark, base, tmp_path) -> None:
    from spark_audit.spark_engine import SparkEngine

    eng = SparkEngine(spark)
    for name in SPARK_CASES:
        got = planted.audit_case(base, tmp_path / "spark" / name, planted.CASES[name], eng)
        local = planted.audit_case(base, tmp_path / "local" / name, planted.CASES[name])
        assert got["ok"], (name, got["missed"], got["overstated"])
        # Same rows (file ids follow the same inventory order on both engines).
        rows = [sorted(r["_result"].findings.select(KEY).to_pylist(), key=repr)
                for r in (got, local)]
        assert rows[0] == rows[1], name
