"""One audit run into an output directory, as the command line and the nightly audit
run it: the engine made, the audit run, its outputs written, nothing printed.

A live broker removes files while it runs: retention deletes old segments and
queue files, a new snapshot replaces the old one. A file listed at the start
and gone when read is therefore not an error of the inputs: the audit lists
the replicas again and starts over (``VANISHED_RETRIES`` times), and what is
gone is then judged as retention judges it. Any other failure, in the driver
or raised from a Spark executor, is exit status 2 with one line saying why.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_audit import inputs, session, tasks
from spark_audit.audit import AuditOptions, AuditResult, run_audit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_audit.engine import Engine

VANISHED_RETRIES = 3
# The line of a Python traceback (also inside a Spark executor's error text)
# that names the exception.
_ERROR_LINE = re.compile(r"^\s*(\w+\.)*\w*(Error|Exception|Exit)\b.*")


@dataclass
class Outcome:
    """One audit run: its exit status, its summary.json (None when the inputs could
    not be read, with ``error`` saying why) and its result."""

    exit: int
    summary: dict[str, Any] | None = None
    result: AuditResult | None = None
    error: str = ""


ENGINES = ("spark", "python")


def audit_to(opts: AuditOptions, out: str, *, engine: str = "spark",
             master: str = session.DEFAULT_MASTER,
             driver_memory: str = session.DEFAULT_DRIVER_MEMORY, progress: bool = True,
             spark: SparkSession | None = None) -> Outcome:
    """Run the audit with ``opts`` and write its outputs to ``out`` (nothing printed)."""
    from spark_audit import report
    from spark_audit.engine import LocalEngine

    if engine not in ENGINES:
        return Outcome(2, error=f"unknown engine {engine!r}: {' or '.join(ENGINES)}")
    if engine == "spark" and spark is None:
        missing = local_inputs_missing(opts)
        if missing:  # said now, not after a SparkSession took seconds to start
            return Outcome(2, error=missing)
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
        res = audit_listing_again(opts, eng)
    except Exception as exc:  # Spark raises its own kinds (Py4JJavaError, PythonException)
        return Outcome(2, error=one_line(exc))
    finally:
        eng.close()
    summary = report.write_outputs(res, out, time.perf_counter() - t0, engine,
                                   master if engine == "spark" else "in-process")
    return Outcome(0 if summary["valid"] else 1, summary, res)




def local_inputs_missing(opts: AuditOptions) -> str:
    """Why inputs on the local file system cannot be read ("" when they can, or
    when some are remote: only the engine's own lister can tell for those):
    the replica directories as `inputs.parse_group_specs` expands them, and
    each client history file."""
    paths = list(opts.history)
    for spec in opts.specs:
        paths += inputs.split_spec(spec)[1]
    if not all(inputs.is_local(p) for p in paths):
        return ""
    try:
        inputs.parse_group_specs(opts.specs)
    except ValueError as exc:
        return str(exc)
    for path in opts.history:
        if not os.path.exists(inputs.local_path(path)):
            return f"{path}: no such history file"
    return ""


def audit_listing_again(opts: AuditOptions, eng: Engine,
                        retries: int = VANISHED_RETRIES) -> AuditResult:
    """``run_audit``, listed and run again when a file vanished while it ran."""
    attempt = 0
    while True:
        try:
            return run_audit(opts, eng)
        except Exception as exc:
            if attempt >= retries or not vanished(exc):
                raise
            attempt += 1


def vanished(exc: BaseException) -> bool:
    """Whether ``exc`` says a file was not found, or was cut after it was listed:
    raised here, or carried as text from a Spark executor (a ``PythonException``
    holds the worker's traceback)."""
    if isinstance(exc, FileNotFoundError | tasks.FileChangedError):
        return True
    text = str(exc)
    return "FileNotFoundError" in text or "FileChangedError" in text


def one_line(exc: BaseException) -> str:
    """The failure in one line: the exception's own line of a long (Spark) message."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) <= 1:
        return text or type(exc).__name__
    named = [line for line in lines if _ERROR_LINE.match(line)]
    return (named[-1] if named else lines[0])[:500]
