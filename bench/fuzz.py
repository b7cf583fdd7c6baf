"""Protocol fuzzing of a real cluster: NameServer + 3 brokers on loopback, JSON out.

Starts the cluster (every admin HTTP app on, a write token set), acknowledges
messages, runs the fuzzers of `chaos.fuzz` against every port for the budget
while acknowledged sends go on, then checks that every process is alive and
answers, that the group converged, and that every acknowledged message is on
every node (docs/fuzzing.md). Prints the run's summary as one JSON line and
exits 1 if anything was found.

    .venv/bin/python bench/fuzz.py --seconds 300 --out fuzz-runs/r1 [--seed N]
    .venv/bin/python bench/fuzz.py --replay fuzz-runs/r1/fuzz-seeds.jsonl [--case 17 --case 40]

The seed log (`fuzz-seeds.jsonl` in --out) has the run seed on its first line
and one line per case; `--seed` re-runs the same sequence of cases, and
`--replay` resends chosen cases one by one to a fresh cluster, then checks it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chaos.fuzz import campaign
from chaos.fuzz.oracle import AckLedger, Targets, verify
from ledgermq.base import loop
from ledgermq.broker.launcher import LocalCluster, wait_admin_url, wait_leader

TOKEN = "fuzz-admin-token"
_ADMIN_LINE = re.compile(r"namesrv admin listening on (http://\S+)")


def start_cluster(base: Path) -> tuple[LocalCluster, Targets]:
    """A NameServer and a 3-node group with every admin app on; stopped by the caller."""
    cluster = LocalCluster(base, nodes=3, admin_listen="127.0.0.1:0",
                           settings={"admin_token": TOKEN, "segment_size_bytes": 8 << 20,
                                     "flush": "async", "replicate": "sync"})
    # The NameServer takes its admin token from the environment.
    saved = os.environ.get("LEDGERMQ_ADMIN_TOKEN")
    os.environ["LEDGERMQ_ADMIN_TOKEN"] = TOKEN
    try:
        cluster.start()
    finally:
        if saved is None:
            os.environ.pop("LEDGERMQ_ADMIN_TOKEN", None)
        else:
            os.environ["LEDGERMQ_ADMIN_TOKEN"] = saved
    try:
        loop.run(wait_leader(cluster))
        urls = {"namesrv": next(m.group(1) for line in cluster.namesrv.output
                                if (m := _ADMIN_LINE.search(line)))}
        for nid in cluster.peers:
            urls[f"broker-{nid}"] = loop.run(wait_admin_url(cluster, nid, 20.0))
    except BaseException:
        cluster.stop()
        raise

    def alive() -> dict[str, bool]:
        names = {f"broker-{nid}": child.alive for nid, child in cluster.brokers.items()}
        names["namesrv"] = cluster.namesrv is not None and cluster.namesrv.alive
        return names

    targets = Targets(namesrv=cluster.namesrv_address,
                      brokers={nid: p.client for nid, p in cluster.peers.items()},
                      raft={nid: p.raft for nid, p in cluster.peers.items()},
                      http=urls, alive=alive, group=cluster.group)
    return cluster, targets


async def _replay(targets: Targets, seeds: Path, numbers: set[int] | None) -> dict:
    cases = campaign.load_cases(seeds, numbers)
    ledger = AckLedger(targets.namesrv, campaign.ORACLE_TOPIC)
    await ledger.start()
    try:
        await ledger.send_many("before", 20)
        done = await campaign.replay(targets, cases, admin_token=TOKEN)
        problems = await verify(targets, ledger)
    finally:
        await ledger.close()
    findings = [campaign._record(c, o) for c, o in done if o.findings]
    return {"passed": not problems and not findings, "replayed": len(done),
            "findings": findings, "problems": problems}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="fuzzing time budget")
    parser.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    parser.add_argument("--seed", type=int, default=None, help="run seed (default: random)")
    parser.add_argument("--workers", type=int, default=4, help="cases in flight")
    parser.add_argument("--only", default="", help="comma-separated generator names")
    parser.add_argument("--out", default=None, help="output directory (seed log, logs)")
    parser.add_argument("--replay", default=None, help="a seed log to replay")
    parser.add_argument("--case", type=int, action="append", help="with --replay: case numbers")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="fuzz-"))
    cluster, targets = start_cluster(out / "cluster")
    try:
        if args.replay:
            summary = loop.run(_replay(targets, Path(args.replay),
                                       set(args.case) if args.case else None))
        else:
            only = frozenset(args.only.split(",")) if args.only else None
            result = loop.run(campaign.run(
                targets, out, campaign.Budget(args.seconds, args.cases), seed=args.seed,
                workers=args.workers, admin_token=TOKEN, only=only))
            summary = result.summary()
    finally:
        cluster.stop()
    summary["out"] = str(out)
    print(json.dumps(summary))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
