"""The audit on a real Spark standalone cluster: a master and two workers, separate JVMs.

The cluster is started from the pyspark distribution (``spark_audit.cluster``), the
audit is submitted to it with ``spark-submit --master spark://...``
(``cluster_job``): the planted suite's clean copy through the command line,
and three planted faults (a flipped body on one follower, an acknowledged
message erased on every replica, a diverged term). Each fault must be found
exactly, pointing at its file and offset, and every finding must be the one
the local Spark session finds on the same data. Every daemon is stopped by
PID when the test ends.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support import have_java, require

from spark_audit import cluster as standalone
from spark_audit import planted
from tests.chaos.histories import REAL_RUN

from . import cluster_job

pytestmark = pytest.mark.spark

CASES = ("body_flip", "acked_erased_everywhere", "diverged_term")


def test_a_standalone_cluster_finds_every_planted_fault_like_local(spark, tmp_path) -> None:
    require(have_java(), "Java is needed for a Spark standalone cluster")
    from spark_audit.spark_engine import SparkEngine

    base = planted.unpack_base(REAL_RUN, tmp_path / "base")
    (tmp_path / "cluster").mkdir()
    out = tmp_path / "result.json"
    repo = Path(__file__).resolve().parents[2]
    env = {**standalone.env(), "PYTHONPATH": os.pathsep.join(
        [str(repo), os.environ.get("PYTHONPATH", "")])}
    with standalone.cluster(tmp_path / "cluster") as c:
        proc = subprocess.run(
            [str(standalone.spark_home() / "bin" / "spark-submit"), "--master", c.url,
             "--driver-memory", "1g", "--conf", "spark.executor.memory=512m",
             cluster_job.__file__, c.url, str(base), str(tmp_path / "work"), str(out), *CASES],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (proc.stderr[-6000:], c.log_text())
        assert all(p.poll() is None for p in c.procs), c.log_text()
        pids = [p.pid for p in c.procs]
    # Stopped by PID: none of the daemons is left.
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    got = json.loads(out.read_text())
    assert got["master"] == c.url and got["executors"] == 2, got
    assert got["clean"]["exit"] == 0 and got["clean"]["summary"]["valid"]
    assert got["clean"]["summary"]["engine"] == "spark"
    assert got["clean"]["summary"]["master"] == c.url
    local = SparkEngine(spark)
    for name in CASES:
        case = got[name]
        assert case["ok"], (name, case["missed"], case["overstated"], case["points_at"])
        mine = planted.audit_case(base, tmp_path / "local" / name, planted.CASES[name], local)
        assert mine["ok"]
        rows = mine["_result"].findings.select(cluster_job.KEY).to_pylist()
        assert sorted(case["rows"], key=repr) == sorted(rows, key=repr), name
    # Each fault names its path and offset.
    where = got["body_flip"]["points_at"]
    assert where["file"].startswith("commitlog/") and where["file_offset"] > 0
    where = got["diverged_term"]["points_at"]
    assert where["file"].startswith("commitlog/") and where["file_offset"] >= 0
    erased = got["acked_erased_everywhere"]["named"]
    lost = [r for r in erased if r["kind"] == "acked_send_missing"]
    assert lost and all(r["phys_offset"] > 0 for r in lost)
    # On every replica: the ConsumeQueue unit of the erased message, file and slot.
    dangling = {(r["replica"], r["phys_offset"]) for r in erased if r["kind"] == "cq_dangling"
                and "/consumequeue/" in r["file"]}
    assert {r for r, _ in dangling} == {"n1", "n2", "n3"}
    assert {o for _, o in dangling} <= {r["phys_offset"] for r in lost}
