"""Command line of the audit: ``python -m spark_audit``, ``spark-submit``, ``ledgermq audit``.

Exit status: 0 when every check passes, 1 when any check fails (so a nightly
scheduler can alert), 2 when the inputs cannot be read.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from spark_audit import fmt, session
from spark_audit.audit import AuditOptions, run_audit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run(specs: list[str], *, out: str = "audit-out", master: str = session.DEFAULT_MASTER,
        history: list[str] | None = None, engine: str = "spark",
        driver_memory: str = session.DEFAULT_DRIVER_MEMORY, progress: bool = True,
        max_entry_size: int = fmt.DEFAULT_MAX_ENTRY_SIZE, segment_size: int = 0,
        max_examples: int = 20, share_identical: bool = True,
        spark: SparkSession | None = None) -> int:
    """Run the audit and write its outputs; returns the exit status."""
    from spark_audit import report
    from spark_audit.engine import Engine, LocalEngine

    t0 = time.perf_counter()
    opts = AuditOptions(list(specs), list(history or []), max_entry_size, segment_size,
                        max_examples, share_identical)
    eng: Engine
    if engine == "python":
        eng = LocalEngine()
    else:
        from spark_audit.spark_engine import SparkEngine

        spark = spark or session.get_session(master, driver_memory=driver_memory,
                                             progress=progress)
        eng = SparkEngine(spark)
    try:
        res = run_audit(opts, eng)
    except (ValueError, OSError) as exc:
        print(f"audit: cannot read the inputs: {exc}", file=sys.stderr)
        return 2
    finally:
        eng.close()
    summary = report.write_outputs(res, out, time.perf_counter() - t0, engine,
                                   master if engine == "spark" else "in-process")
    for name, c in summary["checks"].items():
        state = "skipped" if c.get("skipped") else ("ok" if c["valid"] else "FAILED")
        print(f"{name:15} {state:8} violations={c['violations']} info={c['info']}")
    for g in summary["groups"]:
        # What each replica keeps (retention moves the first index) and what all share.
        shared = (f"{g['shared_first_index']}..{g['shared_last_index']}"
                  if g["shared_first_index"] else "nothing")
        kept = ", ".join(f"{r['replica']} {r['first_index']}..{r['last_index']}"
                         for r in summary["replicas"] if r["group"] == g["group"])
        print(f"group {g['group']}: committed {g['committed_index']}, shared {shared}; {kept}"
              f"{report.retained_away_text(g)}")
    print(f"audit {'PASSED' if summary['valid'] else 'FAILED'}: {out}/summary.json, "
          f"{out}/report.html")
    return 0 if summary["valid"] else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spark_audit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("groups", nargs="+", metavar="GROUP_SPEC",
                   help="NAME=DIR,DIR,... (one data dir per replica) or a ROOT/<group>/<node>/ "
                        "directory; local paths or Hadoop URIs")
    p.add_argument("--out", default="audit-out", help="output directory (default audit-out)")
    p.add_argument("--master", default=session.DEFAULT_MASTER,
                   help="Spark master URL (default local[*])")
    p.add_argument("--history", action="append", default=[], metavar="FILE",
                   help="client history.jsonl (repeatable)")
    p.add_argument("--engine", choices=["spark", "python"], default="spark",
                   help="spark (default) or python: in-process, local paths only")
    p.add_argument("--driver-memory", default=session.DEFAULT_DRIVER_MEMORY)
    p.add_argument("--no-progress", action="store_true", help="hide Spark's progress bar")
    p.add_argument("--max-entry-size", type=int, default=fmt.DEFAULT_MAX_ENTRY_SIZE,
                   help="the brokers' entry_size_bytes_max")
    p.add_argument("--segment-size", type=int, default=0,
                   help="segment_size_bytes (default: inferred from segment names)")
    p.add_argument("--max-examples", type=int, default=20)
    p.add_argument("--no-share", action="store_true",
                   help="decode and validate every replica from its own bytes, even where it "
                        "is identical to another (slower; cross-checks the sharing)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    return run(a.groups, out=a.out, master=a.master, history=a.history, engine=a.engine,
               driver_memory=a.driver_memory, progress=not a.no_progress,
               max_entry_size=a.max_entry_size, segment_size=a.segment_size,
               max_examples=a.max_examples, share_identical=not a.no_share)
