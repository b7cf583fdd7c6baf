"""The distributed audit (``distributed``: keyed map and reduce calls) finds exactly what
the in-process engine finds, row for row, on every fault scenario.

``LocalFlowEngine`` runs the very map and reduce functions the Spark engine
runs, in this process, so every planted case is checked here in seconds;
``test_spark``, ``test_planted`` and ``test_standalone`` run them on Spark.
Also: what reaches the driver does not grow with the log (a healthy group is
one run), and the fast paths (identical replicas over an index range, twin
replicas in the queue join, intact segments) change nothing.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from spark_audit import dlog, dmsgs, parse, planted
from spark_audit.audit import AuditOptions, run_audit
from spark_audit.engine import LocalEngine, LocalFlowEngine
from tests.chaos.histories import REAL_RUN

from . import scenarios

KEY = ["check", "kind", "severity", "gid", "rid", "fid", "file_offset", "index", "topic",
       "queue_id", "slot", "phys_offset", "count", "detail"]


def rows(res, work: Path | None = None) -> list[dict]:
    out = res.findings.select(KEY).to_pylist()
    if work is not None:
        for r in out:
            r["detail"] = r["detail"].replace(str(work), "WORK")
    return sorted(out, key=repr)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return planted.unpack_base(REAL_RUN, tmp_path_factory.mktemp("planted") / "base")


@pytest.mark.parametrize("name", ["clean", *planted.CASES])
def test_each_planted_case_gives_the_in_process_findings(base, tmp_path, name) -> None:
    case = None if name == "clean" else planted.CASES[name]
    mine = planted.audit_case(base, tmp_path / "a" / "w", case, LocalFlowEngine())
    theirs = planted.audit_case(base, tmp_path / "b" / "w", case, LocalEngine())
    assert mine["ok"], json.dumps({k: v for k, v in mine.items() if k != "_result"})
    assert rows(mine["_result"], tmp_path / "a") == rows(theirs["_result"], tmp_path / "b")
    a, b = mine["_result"], theirs["_result"]
    assert a.history_stats == b.history_stats
    assert a.counts["messages"] == b.counts["messages"]
    for (_, sa), (_, sb) in zip(sorted(a.groups.items()), sorted(b.groups.items()),
                                strict=True):
        assert (sa.committed, sa.quorum_end, sa.sources, sa.retained_away) == (
            sb.committed, sb.quorum_end, sb.sources, sb.retained_away)
        assert [(m.agree_start, m.agree_end, m.first_index, m.last_index)
                for m in sa.replicas.values()] == [
            (m.agree_start, m.agree_end, m.first_index, m.last_index)
            for m in sb.replicas.values()]


def test_the_fault_scenarios_give_the_in_process_findings(tmp_path) -> None:
    layouts = {name: make(str(tmp_path / "data" / name))
               for name, make in scenarios.SCENARIOS.items()}
    hist = tmp_path / "h.jsonl"
    scenarios.write_history(str(hist), "clean", layouts["clean"]["n1"], True)
    opts = AuditOptions([str(tmp_path / "data")], [str(hist)])
    mine, theirs = run_audit(opts, LocalFlowEngine()), run_audit(opts, LocalEngine())
    assert rows(mine) == rows(theirs)
    assert not mine.valid and mine.counts["messages"] == theirs.counts["messages"]


def test_the_general_paths_give_what_the_fast_paths_give(base, tmp_path, monkeypatch) -> None:
    """Forced off: identical index ranges, intact segments, twin replicas."""
    for name in ("clean", "diverged_term", "cq_wrong_size", "zeroed_page"):
        case = None if name == "clean" else planted.CASES[name]
        fast = planted.audit_case(base, tmp_path / "f" / name, case, LocalFlowEngine())
        with monkeypatch.context() as m:
            m.setattr(dlog, "_uniform", lambda per: False)
            m.setattr(parse, "_scan_intact", lambda *a: None)
            m.setattr(dlog, "_complete", lambda ix, en: False)
            m.setattr(dmsgs, "_twins", lambda a, b: False)
            slow = planted.audit_case(base, tmp_path / "s" / name, case, LocalFlowEngine())
        assert rows(fast["_result"], tmp_path / "f") == rows(slow["_result"], tmp_path / "s")


def test_the_driver_gets_runs_not_rows(tmp_path) -> None:
    """A healthy group comes back as one run however long its log is."""
    spec = importlib.util.spec_from_file_location(
        "bench_audit", Path(__file__).resolve().parents[2] / "bench" / "audit.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    got = []
    for n in (3000, 30000):
        g = tmp_path / str(n) / "g"
        bench.write_replica(str(g / "n1"), n, 1, 256, 1 << 20)
        for r in ("n2", "n3"):
            shutil.copytree(g / "n1", g / r)
        res = run_audit(AuditOptions([str(g)]), LocalFlowEngine())
        assert res.valid and res.counts["entries"] == 3 * n
        got.append(res.counts["runs"])
        # Each record decoded once (the reference's, shared by the identical replicas).
        assert res.counts["messages_decoded"] == n and res.counts["messages"] == 3 * n
    assert got == [1, 1]
