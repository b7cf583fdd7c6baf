"""The long evidence matrix: every nemesis, 3 and 5 nodes, plus the bite runs.

    python -m chaos.matrix --out chaos-matrix [--time-limit 60] [--only NAME,...]
                           [--security open|secure|open,secure] [--secure] [--retention]
                           [--membership]

Part 1 (must be valid): flush=sync, replicate=sync, every nemesis alone and
the power-loss composites, on 3 and 5 nodes, `--time-limit` seconds each.
Part 2 (must bite): replicate=async with partition-leader must report lost
acknowledged messages; power loss of every node must lose messages with
flush=async and none with flush=sync. replicate=async with kill-leader is
run and reported, not required to bite (see BITES).

Security is a dimension of its own: `--security secure` (or `--secure`)
runs every cell above with authentication and TLS on every port and the
workload as an ACL user (chaos.security), named `secure-<cell>`, with the
same expectations: a sync cell must stay valid, a bite cell must still bite.
`--security open,secure` runs both.

Retention is another (`--retention`): instead of the cells above, the
flush=sync, replicate=sync cells (every nemesis alone, the composites and
the power loss of every node), named `retention-<cell>`, run with
chaos.retention's small segments, small `retention_bytes` and frequent
snapshots, so segments are deleted while the faults run and a node down
for a fault period rejoins by snapshot install. Each must be valid (0 lost
among the acknowledged messages still inside retention when the drain
read) and must show deletions (a run where no node deleted a segment is
not valid). One bite runs with them: replicate=async with the leader cut
off must still report lost acknowledged messages with retention on (the
expired ones never hide a loss). The rows add `expired`,
`expired_unknown`, segments deleted, the highest first index and the
installs per cell.

Membership is a third (`--membership`): instead of the cells above, the
membership cells (`MEMBERSHIP`, chaos.membership) on flush=sync,
replicate=sync: replace every node of a 3-node group one by one, grow 3 -> 5,
shrink 5 -> 3, remove the leader twice, wipe a follower's disk and repair it,
damage one and repair it with `ledgermq node repair`, and random churn mixed
with kills and partitions. Each must be valid (0 lost, 0 duplicated, every
step done, the intended configuration reached); the rows add each step with
its availability gap. `--time-limit` is a cap for the plan cells: they end
when their plan is carried out.

Writes one run directory per cell and `matrix.json` (one summary row per
run, with the nodes that did not come back); exits 1 if a sync cell is
invalid or a bite cell found nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from chaos.nemesis import REGISTRY
from chaos.retention import RetentionSpec
from chaos.runner import RunConfig, main_log, run
from chaos.schedule import Schedule

# The file faults damage data the node had fsynced; recovery rightly refuses
# to serve it, so the victim may stay down (a minority). The cells say so
# explicitly: reported in the row, not held against the run. Every other
# cell's nodes must all come back.
DECLARED = {"truncate": "truncate:may_stay_down=1", "bitflip": "bitflip:may_stay_down=1"}
COMPOSITES = ("power-loss:targets=one,pause", "power-loss:targets=one,partition-halves",
              "kill-leader,partition-halves")
BITES: tuple[tuple[str, str, str, str, str, dict[str, Any]], ...] = (
    # (name, nemesis, flush, replicate, expect, broker config): "lost" cells
    # must report lost > 0. "report" cells are run and listed but pass either
    # way: a SIGKILL'ed leader has already written each entry to its
    # followers' sockets before it acknowledged it (Ready messages go out
    # before the local append), so replicate=async loses an ack to a kill
    # only when replication was backlogged; 20,529 acks at 2,000/s lost none.
    ("async-kill-leader", "kill-leader", "async", "async", "report", {}),
    ("async-partition-leader", "partition-leader", "async", "async", "lost", {}),
    # A power loss of every node loses what was acknowledged after the last
    # sync of the node that synced last. With the default 200 ms interval at
    # 100 messages/s that is ~5 messages on average and sometimes none (one
    # run of 1,480 acks lost nothing); a 2 s interval makes the window ~10x
    # wider, so the cell shows the consequence instead of a coin toss. The
    # ConsumeQueue checkpoint syncs the CommitLog up to what it claims, so its
    # interval (1 s by default) is widened too.
    ("flush-async-power-loss", "power-loss:targets=all", "async", "sync", "lost",
     {"flush_interval_ms": 2000, "cq_checkpoint_interval_ms": 5000}),
)


SECURITIES = ("open", "secure")

# (name, nemesis, nodes, schedule (kind, on s, off s)): plan cells take one
# step per period and end when done; churn runs for the whole time limit.
MEMBERSHIP: tuple[tuple[str, str, int, tuple[str, float, float]], ...] = (
    ("membership-replace-each-3n", "replace-each", 3, ("fixed", 2, 4)),
    ("membership-grow-3n", "grow:target=5", 3, ("fixed", 2, 4)),
    ("membership-shrink-5n", "shrink:target=3", 5, ("fixed", 2, 4)),
    ("membership-remove-leader-3n", "remove-leader:count=2", 3, ("fixed", 2, 4)),
    ("membership-wipe-repair-3n", "wipe-repair:mode=wipe", 3, ("fixed", 5, 4)),
    ("membership-corrupt-repair-3n", "wipe-repair:mode=corrupt", 3, ("fixed", 5, 4)),
    ("membership-churn-kill-partition-3n", "membership,kill,partition-halves", 3,
     ("random", 8, 6)),
)


def membership_cells() -> list[dict[str, Any]]:
    """The membership dimension: each cell must be valid."""
    return [{"name": name, "nemesis": spec, "nodes": nodes, "flush": "sync",
             "replicate": "sync", "expect": "valid", "secure": False,
             "schedule": schedule} for name, spec, nodes, schedule in MEMBERSHIP]


def cells(nodes: list[int], securities: tuple[str, ...] = ("open",)) -> list[dict[str, Any]]:
    """Every cell for `nodes`, once per security mode (open cells keep their
    names; secured ones are `secure-<name>` with `secure: True`)."""
    unknown = set(securities) - set(SECURITIES)
    if unknown:
        raise ValueError(f"unknown security mode(s) {sorted(unknown)}; "
                         f"choose from {', '.join(SECURITIES)}")
    base = _cells(nodes)
    out = []
    for security in securities:
        for cell in base:
            if security == "open":
                out.append(dict(cell, secure=False))
            else:
                out.append(dict(cell, name=f"secure-{cell['name']}", secure=True))
    return out


def retention_cells(nodes: list[int]) -> list[dict[str, Any]]:
    """The retention dimension: every sync cell of `nodes` and the
    replicate=async partition-leader bite, renamed `retention-<name>`,
    with `retention: True`."""
    every = _cells(nodes)
    base = [c for c in every if c["name"].startswith("sync-")
            or c["name"].startswith("flush-sync-power-loss")]
    bite = next(c for c in every if c["name"] == "async-partition-leader")
    return [dict(c, name=f"retention-{c['name']}", retention=True, secure=False)
            for c in (*base, bite)]


def _cells(nodes: list[int]) -> list[dict[str, Any]]:
    out = []
    for n in nodes:
        for spec in (*REGISTRY, *COMPOSITES):
            out.append({"name": f"sync-{spec.replace(':', '_').replace(',', '+')}-{n}n",
                        "nemesis": DECLARED.get(spec, spec), "nodes": n, "flush": "sync",
                        "replicate": "sync", "expect": "valid"})
    for name, spec, flush, replicate, expect, broker_config in BITES:
        out.append({"name": name, "nemesis": spec, "nodes": 3, "flush": flush,
                    "replicate": replicate, "expect": expect, "broker_config": broker_config})
    out.append({"name": "flush-sync-power-loss", "nemesis": "power-loss:targets=all",
                "nodes": 3, "flush": "sync", "replicate": "sync", "expect": "valid"})
    # The power-loss pair again on the other group sizes asked for: flush=sync
    # loses nothing, flush=async loses acknowledged messages and still every
    # replica catches up afterwards.
    async_loss = next(b for b in BITES if b[0] == "flush-async-power-loss")
    for n in nodes:
        if n == 3:
            continue
        out.append({"name": f"flush-async-power-loss-{n}n", "nemesis": async_loss[1],
                    "nodes": n, "flush": "async", "replicate": "sync", "expect": "lost",
                    "broker_config": async_loss[5]})
        out.append({"name": f"flush-sync-power-loss-{n}n", "nemesis": "power-loss:targets=all",
                    "nodes": n, "flush": "sync", "replicate": "sync", "expect": "valid"})
    return out


def cell_passed(expect: str, results: dict[str, Any]) -> bool:
    """A run's verdict for its cell: "valid" must be valid (checker, run,
    nodes, convergence; with retention, segments deleted), "lost" must lose
    acknowledged messages (the checker bites) with every node back and caught
    up afterwards (with retention: and segments deleted), "report" passes."""
    if expect == "valid":
        return bool(results["valid"])
    if expect == "lost":
        convergence = results["phases"].get("convergence") or {}
        exercised = not results.get("retention") or bool(
            results["retention"]["nodes_with_deletions"])
        return (results["checker"]["counts"]["lost"] > 0 and bool(results["nodes"]["ok"])
                and bool(convergence.get("converged")) and exercised)
    return True


def membership_row(results: dict[str, Any]) -> dict[str, Any]:
    """A membership run's figures for its matrix row (nothing for other runs)."""
    changes = results.get("membership")
    if changes is None:
        return {}
    counts = results["checker"]["counts"]
    return {"lost": counts["lost"], "duplicated": counts["duplicated"],
            "final_voters": (changes["final"] or {}).get("voters"),
            "intended": changes["intended"],
            "steps": [{"step": s["step"], "nodes": s["nodes"], "ok": s["ok"],
                       "seconds": s["seconds"], "gap_s": s["gap_s"]} for s in changes["steps"]],
            "membership_problems": changes["problems"]}


def retention_row(results: dict[str, Any]) -> dict[str, Any]:
    """A retention run's figures for its matrix row (nothing for other runs)."""
    kept = results.get("retention")
    if kept is None:
        return {}
    counts = results["checker"]["counts"]
    return {"lost": counts["lost"], "expired": counts["expired"],
            "expired_unknown": counts["expired_unknown"],
            "expired_read_live": results["checker"]["retention"]["expired_read_live"],
            "moved_forward": counts["moved_forward"],
            "segments_deleted": kept["segments_deleted"],
            "segments_gone_per_node": {n: v["disk"].get("segments_gone")
                                       for n, v in kept["nodes"].items()},
            "first_index_max": kept["first_index_max"], "installs": kept["installs"],
            "nodes_installed": kept["nodes_installed"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="chaos-matrix")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--nodes", default="3,5")
    parser.add_argument("--only", default="", help="comma-separated substrings of cell names")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--security", default="open",
                        help="comma-separated: open, secure (auth + TLS + an ACL user)")
    parser.add_argument("--secure", action="store_true", help="same as --security secure")
    parser.add_argument("--retention", action="store_true",
                        help="the retention cells instead (small segments, small "
                             "retention_bytes, frequent snapshots; see chaos.retention)")
    parser.add_argument("--membership", action="store_true",
                        help="the membership cells instead (replace each node, grow, shrink, "
                             "remove the leader, wipe and repair, churn; chaos.membership)")
    parser.add_argument("--retention-bytes", type=int, default=RetentionSpec.retention_bytes)
    parser.add_argument("--segment-size-bytes", type=int,
                        default=RetentionSpec.segment_size_bytes)
    args = parser.parse_args(argv)
    securities = ("secure",) if args.secure else tuple(s for s in args.security.split(",") if s)
    base = Path(args.out)
    base.mkdir(parents=True, exist_ok=True)
    wanted = [s for s in args.only.split(",") if s]
    rows = []
    ok = True
    try:
        node_counts = [int(n) for n in args.nodes.split(",")]
        if args.membership:
            planned = membership_cells()
        elif args.retention:
            planned = retention_cells(node_counts)
        else:
            planned = cells(node_counts, securities)
        retention = RetentionSpec(retention_bytes=args.retention_bytes,
                                  segment_size_bytes=args.segment_size_bytes,
                                  snapshot_interval_bytes=args.segment_size_bytes // 2)
    except ValueError as exc:
        parser.error(str(exc))
    for cell in planned:
        if wanted and not any(w in cell["name"] for w in wanted):
            continue
        main_log(f"matrix: {cell['name']}")
        config = RunConfig(out=base / cell["name"], nodes=cell["nodes"], nemesis=cell["nemesis"],
                           time_limit=args.time_limit, rate=args.rate, flush=cell["flush"],
                           replicate=cell["replicate"], seed=args.seed,
                           schedule=Schedule(*cell.get("schedule", ("fixed", 10, 10))),
                           log_level="WARNING",
                           broker_config=cell.get("broker_config", {}),
                           secure=cell["secure"],
                           retention=retention if cell.get("retention") else None)
        try:
            results = run(config, log=main_log)
        except Exception as exc:
            rows.append({**cell, "error": repr(exc), "passed": False})
            ok = False
            continue
        check = results["checker"]
        passed = cell_passed(cell["expect"], results)
        ok = ok and passed
        nodes = results["nodes"]
        rows.append({**cell, "passed": passed, "valid": results["valid"],
                     **check["sends"], **{k: v for k, v in check["counts"].items() if v},
                     "longest_unavailable_s": results["availability"]["longest_s"],
                     "converged": (results["phases"].get("convergence") or {}).get("converged"),
                     "restart_failures": len(nodes["restart_failures"]),
                     "down_at_end": nodes["down_at_end"], "allowed_down": nodes["allowed_down"],
                     "invalid_because": results["invalid_because"],
                     **retention_row(results), **membership_row(results)})
        (base / "matrix.json").write_text(json.dumps(rows, indent=1) + "\n")
        main_log(f"matrix: {cell['name']}: {'PASS' if passed else 'FAIL'} {rows[-1]}")
    (base / "matrix.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
