"""The one way the audit (and its tests) get a SparkSession.

Defaults that work on a laptop and in CI: ``local[*]``, the driver bound to
127.0.0.1, workers running this very interpreter (so they find pyarrow and
this package), few shuffle partitions, and the console progress bar on unless
asked otherwise. Any master URL (``spark://``, ``yarn``, ``k8s://``) is passed
through; for a non-local master this package is shipped to the executors as a
zip with ``addPyFile``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
DEFAULT_DRIVER_MEMORY = "4g"


def _package_zip() -> str:
    """Zip ``spark_audit`` so remote executors can import it."""
    pkg = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(tempfile.mkdtemp(prefix="spark_audit_"), "spark_audit.zip")
    with zipfile.ZipFile(path, "w") as z:
        for name in sorted(os.listdir(pkg)):
            if name.endswith(".py"):
                z.write(os.path.join(pkg, name), f"spark_audit/{name}")
    return path


def get_session(master: str = DEFAULT_MASTER, *, app_name: str = "ledgermq-audit",
                driver_memory: str = DEFAULT_DRIVER_MEMORY, progress: bool = True,
                ui: bool = False, shuffle_partitions: int | None = None,
                extra_conf: dict[str, str] | None = None) -> SparkSession:
    """Create (or reuse) the SparkSession the audit runs on."""
    local = master.startswith("local")
    # Workers must run this interpreter: the system python3 lacks pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(master).appName(app_name)
         .config("spark.driver.memory", driver_memory)
         .config("spark.ui.enabled", "true" if ui else "false")
         .config("spark.ui.showConsoleProgress", "true" if progress else "false")
         # With the binaryFile source a row is a whole file (up to 2 GB): one
         # row per Arrow batch keeps batches under Arrow's 2 GB binary limit.
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         .config("spark.python.worker.reuse", "true"))
    if local:
        b = (b.config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1"))
    if shuffle_partitions is None:
        shuffle_partitions = 4 if local else 64
    b = b.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for k, v in (extra_conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    if not local:
        spark.sparkContext.addPyFile(_package_zip())
    spark.sparkContext.setLogLevel("WARN")
    return spark


def warm_up(spark: SparkSession) -> None:
    """Start the Python workers and import the audit in them with a trivial job.

    The first Arrow job of a session pays several seconds once (worker
    processes, imports, JVM code paths); a long-lived session pays it here,
    before any audit, and later audits on the same session do not.
    """

    def touch(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from spark_audit import tasks  # noqa: F401  (imports numpy, pyarrow, crc32c, msgpack)

        yield from batches

    n = spark.sparkContext.defaultParallelism
    spark.range(0, n, 1, n).mapInArrow(touch, "id long").toArrow()
