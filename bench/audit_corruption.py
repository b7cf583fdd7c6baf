"""The audit's planted-corruption suite, on data from a real run.

Two steps:

    # once: a short real run (NameServer + 3 broker processes on loopback,
    # the chaos workload recording its history, a SIGKILL of the leader),
    # its data directories and history packed as the suite's base
    python bench/audit_corruption.py --record tests/fixtures/real-run-3n.tar.gz

    # every time: plant each case into a copy of the base, audit it, compare
    python bench/audit_corruption.py [--base tests/fixtures/real-run-3n.tar.gz]
        [--engine python|spark] [--only CASE,...]

The second step prints one JSON line per case (expected and found violations,
whether they match) and a final line with the totals and the audit's wall
time on the clean copy; exit status 1 when any case misses or overstates.
The cases and their expected findings are ``spark_audit.planted``; the CI
test (tests/spark_audit/test_planted.py) runs the same cases.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_BASE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "real-run-3n.tar.gz"


def record(target: Path, seconds: float, rate: float, seed: int) -> dict:
    """Record the suite's base from real processes and pack it into ``target`` (.tar.gz).

    A NameServer and 3 brokers on 127.0.0.1 (``broker.launcher.LocalCluster``,
    flush=sync, replicate=sync, 16 KiB segments so the log spans several
    files), the chaos workload (producers, a consumer group, the final drain)
    recording its history, and one real failover: the leader is SIGKILLed
    half-way and restarted. The recorded history must check valid.
    """
    import asyncio

    from chaos.checker import check
    from chaos.history import History
    from chaos.workload import Workload, WorkloadSpec
    from ledgermq.broker.launcher import LocalCluster, wait_leader

    async def drive(cluster: LocalCluster, history: History) -> dict:
        workload = Workload(WorkloadSpec(topic="chaos", queues=4, rate=rate, producers=2,
                                         consumers=1), cluster.namesrv_address, history)
        await workload.setup()
        await workload.start()
        await asyncio.sleep(seconds / 2)
        leader = await wait_leader(cluster)
        history.record("nemesis", "info", "start", {"nemesis": "kill-leader", "node": leader})
        cluster.kill(leader)
        await wait_leader(cluster, exclude=(leader,))
        await asyncio.sleep(1.0)
        cluster.start_node(leader)
        history.record("nemesis", "info", "stop", {"nemesis": "kill-leader", "node": leader})
        await asyncio.sleep(seconds / 2)
        await workload.stop_producers()
        await workload.stop_consumers()
        drained = await workload.drain(60.0)
        return {"killed": leader, "drained": drained}

    with tempfile.TemporaryDirectory(prefix="lmq-record-") as tmp:
        base = Path(tmp)
        settings = {"segment_size_bytes": 16384, "flush": "sync", "replicate": "sync"}
        with LocalCluster(base / "cluster", nodes=3, group="chaos", settings=settings) \
                as cluster, History(base / "history.jsonl") as history:
            asyncio.run(wait_leader(cluster))
            phases = asyncio.run(drive(cluster, history))
        result = check(history.ops)
        if not result["valid"]:
            raise SystemExit(f"the recorded run is not valid: {result['counts']}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(target, "w:gz") as tar:
            tar.add(base / "history.jsonl", arcname="history.jsonl")
            for node in sorted(p for p in (base / "cluster").iterdir()
                               if p.is_dir() and p.name.startswith("n")):
                for path in sorted(node.rglob("*")):
                    if path.is_file() and path.name != "LOCK":
                        tar.add(path, arcname=f"data/{node.name}/{path.relative_to(node)}")
        return {"record": str(target), "bytes": target.stat().st_size, **phases,
                "sends": result["sends"], "checker_valid": result["valid"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--record", type=Path, help="record a new base into this .tar.gz and exit")
    p.add_argument("--seconds", type=float, default=7.0, help="fault time of the recorded run")
    p.add_argument("--rate", type=float, default=30.0, help="sends per second when recording")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--base", type=Path, default=DEFAULT_BASE)
    p.add_argument("--engine", choices=["python", "spark"], default="python")
    p.add_argument("--only", default="", help="comma-separated case names")
    a = p.parse_args(argv)
    if a.record:
        print(json.dumps(record(a.record, a.seconds, a.rate, a.seed)))
        return 0
    from spark_audit import planted

    names = [n for n in a.only.split(",") if n] or list(planted.CASES)
    eng = None
    if a.engine == "spark":
        from spark_audit import session
        from spark_audit.spark_engine import SparkEngine

        spark = session.get_session("local[2]", progress=False)
        session.warm_up(spark)  # the session's one-time first-job cost, kept out of the timing
        eng = SparkEngine(spark)
    work = Path(tempfile.mkdtemp(prefix="lmq-planted-"))
    try:
        base = planted.unpack_base(a.base, work / "base")
        t0 = time.perf_counter()
        clean = planted.audit_case(base, work / "clean", None, eng)
        clean_s = time.perf_counter() - t0
        clean.pop("_result")
        rows = []
        for name in names:
            t1 = time.perf_counter()
            got = planted.audit_case(base, work / name, planted.CASES[name], eng)
            got.pop("_result")
            rows.append({"case": name, **got, "seconds": round(time.perf_counter() - t1, 3)})
            print(json.dumps(rows[-1]))
        ok = sum(r["ok"] for r in rows)
        print(json.dumps({"cases": len(rows), "caught_exactly": ok, "clean_ok": clean["ok"],
                          "clean_findings": clean["found"], "engine": a.engine,
                          "clean_audit_s": round(clean_s, 3),
                          "clean_audit_inner_s": clean["audit_s"]}))
        return 0 if ok == len(rows) and clean["ok"] else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
