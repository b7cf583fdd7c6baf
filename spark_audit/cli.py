"""Command line of the audit: ``python -m spark_audit``, ``spark-submit``, ``ledgermq audit``.

Exit status: 0 when every check passes, 1 when any check fails (so a nightly
scheduler can alert), 2 when the inputs cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from spark_audit import fmt, session, window
from spark_audit.audit import AuditOptions
from spark_audit.runs import audit_to

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run(specs: list[str], *, out: str = "audit-out", master: str = session.DEFAULT_MASTER,
        history: list[str] | None = None, engine: str = "spark",
        driver_memory: str = session.DEFAULT_DRIVER_MEMORY, progress: bool = True,
        max_entry_size: int = fmt.DEFAULT_MAX_ENTRY_SIZE, segment_size: int = 0,
        max_examples: int = 20, share_identical: bool = True,
        spark: SparkSession | None = None, cuts: list[str] | None = None,
        starts: list[str] | None = None) -> int:
    """Run the audit and write its outputs; returns the exit status.

    ``cuts`` and ``starts`` are ``GROUP=INDEX`` options (``--cut``, ``--from``):
    the group is audited only from / up to that Raft index (``window``).
    """
    try:
        bounds = window.bounds_from_options(list(cuts or []), list(starts or []))
        opts = AuditOptions(list(specs), list(history or []), max_entry_size, segment_size,
                            max_examples, share_identical, bounds)
    except ValueError as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return 2
    outcome = audit_to(opts, out, engine=engine, master=master, driver_memory=driver_memory,
                       progress=progress, spark=spark)
    if outcome.summary is None:
        print(f"audit: cannot read the inputs: {outcome.error}", file=sys.stderr)
        return 2
    print_summary(outcome.summary, out)
    return outcome.exit


def print_summary(summary: dict[str, Any], out: str) -> None:
    """The console lines of one audit: per check, per group, the verdict."""
    from spark_audit import report

    for name, c in summary["checks"].items():
        state = "skipped" if c.get("skipped") else ("ok" if c["valid"] else "FAILED")
        print(f"{name:15} {state:8} violations={c['violations']} info={c['info']}")
    for g in summary["groups"]:
        # What each replica keeps (retention moves the first index) and what all share.
        shared = (f"{g['shared_first_index']}..{g['shared_last_index']}"
                  if g["shared_first_index"] else "nothing")
        kept = ", ".join(f"{r['replica']} {r['first_index']}..{r['last_index']}"
                         for r in summary["replicas"] if r["group"] == g["group"])
        w = g["window"]
        seen = (f"; window {w['from']}..{w['cut'] or 'end'}"
                if w["from"] > 1 or w["cut"] else "")
        print(f"group {g['group']}: committed {g['committed_index']}, shared {shared}; {kept}"
              f"{report.retained_away_text(g)}{seen}")
    print(f"audit {'PASSED' if summary['valid'] else 'FAILED'}: {out}/summary.json, "
          f"{out}/report.html")


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
    p.add_argument("--cut", action="append", default=[], metavar="GROUP=INDEX",
                   help="audit GROUP only up to this Raft index: bytes and ConsumeQueue units "
                        "past it are neither read nor judged (repeatable)")
    p.add_argument("--from", dest="starts", action="append", default=[],
                   metavar="GROUP=INDEX",
                   help="audit GROUP only from this Raft index: the entries before it count "
                        "as verified before, files wholly below it are not read (repeatable)")
    p.add_argument("--nightly", action="store_true",
                   help="the nightly, incremental audit (state in --state): what is new since "
                        "the last night plus a rolling re-verification of older ranges")
    p.add_argument("--state", metavar="DIR", help="the nightly state directory")
    p.add_argument("--rolling-nights", type=int, default=7, metavar="N",
                   help="re-verify every retained index within N nights (default 7)")
    p.add_argument("--digest-block", type=int, default=0, metavar="B",
                   help="a new manifest's digest span (a power of two up to 2^19; "
                        "default 65536)")
    p.add_argument("--manifest-key-file", default="", metavar="FILE",
                   help="a secret file (mode 0600) whose content keys the manifests' seals "
                        "(HMAC-SHA256): a manifest rewritten without the key is refused")
    return p


def nightly(specs: list[str], state: str, *, rolling_nights: int = 7,
            cuts: list[str] | None = None, engine: str = "spark",
            master: str = session.DEFAULT_MASTER,
            driver_memory: str = session.DEFAULT_DRIVER_MEMORY, progress: bool = True,
            max_entry_size: int = fmt.DEFAULT_MAX_ENTRY_SIZE, segment_size: int = 0,
            digest_block: int = 0, manifest_key_file: str = "") -> int:
    """``--nightly``: one night of the incremental audit (``nightly``); the exit status.
    ``manifest_key_file``: a secret file whose content keys the manifests' seals."""
    from ledgermq.wire.auth import read_secret_file
    from spark_audit import digest
    from spark_audit import nightly as night

    try:
        hi = window.parse_specs(list(cuts or []), "--cut")
        block = digest.check_block(digest_block or digest.DEFAULT_BLOCK)
        key = read_secret_file(manifest_key_file) if manifest_key_file else None
    except ValueError as exc:  # SecretFileError is a ValueError
        print(f"audit night ERROR: {exc}")
        return 2
    return night.run_night(night.NightOptions(
        list(specs), state, rolling_nights, hi, engine, master, driver_memory, progress,
        max_entry_size, segment_size, block=block, manifest_key=key))


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.nightly or a.state:
        if not (a.nightly and a.state):
            print("audit: --nightly needs --state DIR (and --state goes with --nightly)",
                  file=sys.stderr)
            return 2
        if a.history or a.starts:
            print("audit: --nightly chooses its own windows and reads no history",
                  file=sys.stderr)
            return 2
        return nightly(a.groups, a.state, rolling_nights=a.rolling_nights, cuts=a.cut,
                       engine=a.engine, master=a.master, driver_memory=a.driver_memory,
                       progress=not a.no_progress, max_entry_size=a.max_entry_size,
                       segment_size=a.segment_size, digest_block=a.digest_block,
                       manifest_key_file=a.manifest_key_file)
    return run(a.groups, out=a.out, master=a.master, history=a.history, engine=a.engine,
               driver_memory=a.driver_memory, progress=not a.no_progress,
               max_entry_size=a.max_entry_size, segment_size=a.segment_size,
               max_examples=a.max_examples, share_identical=not a.no_share, cuts=a.cut,
               starts=a.starts)
