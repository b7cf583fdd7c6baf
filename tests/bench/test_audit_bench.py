"""bench/audit.py: its generator writes groups the audit reads clean, and it runs.

The generator is vectorized (whole segments as arrays) so the benchmark can
write tens of millions of entries; what it writes must be a valid group by
the audit's own reader, whatever the messages per entry. One short run on
local Spark checks the JSON the docs quote (rates, breakdown, peak memory).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from spark_audit.audit import AuditOptions, run_audit
from spark_audit.engine import LocalEngine, LocalFlowEngine

REPO = Path(__file__).resolve().parents[2]


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_audit", REPO / "bench" / "audit.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("per_entry", "entries"), [(1, 5000), (3, 2001)])
def test_the_generator_writes_a_clean_group(tmp_path: Path, per_entry: int,
                                            entries: int) -> None:
    g = tmp_path / "g"
    got = bench().write_replica(str(g / "n1"), entries, per_entry, 256, 1 << 20)
    assert got == {"entries": entries, "messages": entries * per_entry, "bytes": got["bytes"]}
    for n in ("n2", "n3"):
        shutil.copytree(g / "n1", g / n)
    for k, n in enumerate(("n1", "n2", "n3"), start=1):
        bench().write_identity(str(g / n), k)
    assert len(list((g / "n1" / "commitlog").iterdir())) > 1  # several segments
    key = ["check", "kind", "severity", "rid", "count", "detail"]
    found = []
    for eng in (LocalEngine(), LocalFlowEngine()):
        res = run_audit(AuditOptions([str(g)]), eng)
        assert res.valid, res.findings.to_pylist()
        c = res.counts
        assert (c["entries"], c["index"]) == (3 * entries, 3 * entries)
        assert c["messages"] == c["cq"] == 3 * entries * per_entry
        assert {r["kind"] for r in res.findings.to_pylist()} == {"cq_same_as_reference"}
        found.append(sorted(res.findings.select(key).to_pylist(), key=repr))
    assert found[0] == found[1]


@pytest.mark.spark
def test_the_benchmark_runs_and_reports_memory(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "bench/audit.py", "--per-entry", "1", "--msg-size", "256",
         "--entries", "20000", "--segment-size", str(1 << 20), "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["valid"] and r["entries"] == r["messages"] == 60_000 and r["runs"] == 1
    assert r["messages_decoded"] == 20_000  # the identical replicas share the records
    assert r["entries_per_s_per_core"] > 0 and r["driver_peak_rss_mb"] > 0
    assert set(r["breakdown_s"]) >= {"pass1_spark_job", "pass2_spark_job"}
