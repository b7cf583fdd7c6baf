"""One audit run into an output directory, as the command line and the nightly audit
run it: the engine made, the audit run, its outputs written, nothing printed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_audit import session
from spark_audit.audit import AuditOptions, AuditResult, run_audit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class Outcome:
    """One audit run: its exit status, its summary.json (None when the inputs could
    not be read, with ``error`` saying why) and its result."""

    exit: int
    summary: dict[str, Any] | None = None
    result: AuditResult | None = None
    error: str = ""


def audit_to(opts: AuditOptions, out: str, *, engine: str = "spark",
             master: str = session.DEFAULT_MASTER,
             driver_memory: str = session.DEFAULT_DRIVER_MEMORY, progress: bool = True,
             spark: SparkSession | None = None) -> Outcome:
    """Run the audit with ``opts`` and write its outputs to ``out`` (nothing printed)."""
    from spark_audit import report
    from spark_audit.engine import Engine, LocalEngine

    t0 = time.perf_counter()
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
        return Outcome(2, error=str(exc))
    finally:
        eng.close()
    summary = report.write_outputs(res, out, time.perf_counter() - t0, engine,
                                   master if engine == "spark" else "in-process")
    return Outcome(0 if summary["valid"] else 1, summary, res)


