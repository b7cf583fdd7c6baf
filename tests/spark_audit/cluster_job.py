"""The driver program ``test_standalone`` submits to the standalone cluster.

    spark-submit --master spark://127.0.0.1:PORT tests/spark_audit/cluster_job.py \\
        MASTER BASE WORK OUT.json CASE...

Audits, on one SparkSession of that master: the clean copy of the planted
suite's base through the command line (``cli.run``: summary.json, exit
status), then each named planted case (``planted.audit_case``); writes what
it found, with the finding rows, to OUT.json.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from spark_audit import cli, planted, session
from spark_audit.spark_engine import SparkEngine

KEY = ["check", "kind", "severity", "gid", "rid", "fid", "file_offset", "index", "slot",
       "phys_offset", "count"]


def main(argv: list[str]) -> int:
    master, base, work, out = argv[:4]
    spark = session.get_session(master, app_name="ledgermq-audit-standalone", progress=False,
                                driver_memory="1g",
                                extra_conf={"spark.executor.memory": "512m",
                                            "spark.driver.host": "127.0.0.1",
                                            "spark.driver.bindAddress": "127.0.0.1",
                                            # Wait for both workers' executors.
                                            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                                            "spark.scheduler.maxRegisteredResourcesWaitingTime":
                                                "60s"})
    sc = spark.sparkContext

    def executors() -> int:  # block managers: the driver's and one per executor
        n: int = sc._jsc.sc().getExecutorMemoryStatus().size() - 1
        return n

    end = time.monotonic() + 60
    while executors() < 2 and time.monotonic() < end:
        time.sleep(0.2)
    result: dict[str, object] = {"master": sc.master,
                                 "default_parallelism": sc.defaultParallelism,
                                 "executors": executors()}
    clean = Path(work) / "clean"
    shutil.copytree(base, clean)
    rc = cli.run([str(clean / "data")], out=str(clean / "out"), master=master, spark=spark,
                 history=[str(clean / "history.jsonl")], progress=False)
    result["clean"] = {"exit": rc, "summary": json.loads((clean / "out" / "summary.json")
                                                         .read_text())}
    eng = SparkEngine(spark)
    for name in argv[4:]:
        got = planted.audit_case(Path(base), Path(work) / name, planted.CASES[name], eng)
        res = got.pop("_result")
        names = {(r.gid, r.rid): r.name for r in res.replicas}
        files = {f.fid: f.path for f in res.files}
        got["rows"] = res.findings.select(KEY).to_pylist()
        got["named"] = [{**r, "replica": names.get((r["gid"], r["rid"]), ""),
                         "file": files.get(r["fid"], "")} for r in got["rows"]]
        result[name] = got
    spark.stop()
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
