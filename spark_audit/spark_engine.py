"""The Spark engine: the distributed audit's keyed passes (``SparkFlow``).

``audit.run_audit`` runs the distributed audit on any engine with a
``flow``: ``SparkFlow`` runs each pass as ``mapInArrow`` over the files and
``groupBy("space", "gid", "chunk").applyInArrow`` over the blocks they emit
(``flow``), and collects only the reduce calls' outputs. Files are read as
the tasks below read them:

- Local files (one machine, or paths every executor can open): a DataFrame
  with one row per partition id; ``mapInArrow`` looks up that partition's
  share of the work (dealt by estimated cost, a few partitions per core),
  opens each file itself (memory-mapped, so bytes never pass through the
  JVM).
- Other URIs (``hdfs://``, ``s3a://``): Spark's ``binaryFile`` source reads
  the files (it refuses files over 2 GB; segments of 256 MiB by default, or
  RocketMQ's 1 GiB, fit) and ``mapInArrow`` parses each row's content.

``SparkEngine.run_tasks`` still runs the in-process engine's file tasks
(``tasks``) on Spark, one Arrow row per file, collected with ``toArrow``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_audit import flow, inputs, tasks
from spark_audit.inputs import FileInfo

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


def _spark_schema(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


class SparkEngine:
    """Runs the file tasks on a SparkSession (local[*] or a cluster)."""

    name = "spark"

    def __init__(self, spark: SparkSession, partitions_per_core: int = 2) -> None:
        self.spark = spark
        self.partitions = max(1, partitions_per_core * spark.sparkContext.defaultParallelism)
        self.lister = inputs.Lister(self._list)
        self.flow = SparkFlow(spark, self.partitions)

    def _list(self, path: str) -> list[tuple[str, bool, int]]:
        if inputs.is_local(path):
            return inputs.LOCAL.children(path)
        jvm = self.spark._jvm
        if jvm is None:  # a Spark Connect session: no JVM gateway to list with
            raise ValueError(f"{path}: listing needs a classic SparkSession (not Spark Connect)")
        p = jvm.org.apache.hadoop.fs.Path(path)
        fs = p.getFileSystem(self.spark._jsc.hadoopConfiguration())
        if not fs.exists(p):
            return []
        return sorted((s.getPath().getName(), s.isDirectory(), s.getLen())
                      for s in fs.listStatus(p))

    def read_small(self, files: list[FileInfo]) -> dict[int, bytes]:
        out = {}
        remote = [f for f in files if not inputs.is_local(f.path)]
        for f in files:
            if inputs.is_local(f.path):
                with open(inputs.local_path(f.path), "rb") as fh:
                    out[f.fid] = fh.read()
        if remote:
            by_key = {inputs.path_key(f.path): f.fid for f in remote}
            rows = (self.spark.read.format("binaryFile").load([f.path for f in remote])
                    .select("path", "content").collect())
            for row in rows:
                out[by_key[inputs.path_key(row.path)]] = bytes(row.content)
        return out

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """A few bytes of a file: directly for local paths, else through the Hadoop
        FileSystem of the session (a positioned read; nothing else of the file)."""
        if inputs.is_local(path):
            return tasks.read_local_range(path, offset, length)
        jvm = self.spark._jvm
        if jvm is None:
            raise ValueError(f"{path}: reading needs a classic SparkSession (not Spark Connect)")
        p = jvm.org.apache.hadoop.fs.Path(path)
        fs = p.getFileSystem(self.spark._jsc.hadoopConfiguration())
        size = fs.getFileStatus(p).getLen()
        n = max(0, min(length, size - offset))
        stream = fs.open(p)
        try:
            stream.seek(offset)
            # py4j returns a Java byte[] as Python bytes.
            return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream, n)) if n else b""
        finally:
            stream.close()

    def run_tasks(self, todo: list[tasks.FileTask], max_entry_size: int
                  ) -> list[tasks.FileResult]:
        if not todo:
            return []
        schema = _spark_schema(tasks.RESULT_SCHEMA)
        if all(inputs.is_local(t.info.path) for t in todo):
            parts = tasks.balance(todo, self.partitions)

            def run_part(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for batch in batches:
                    for j in batch.column(0).to_pylist():
                        for t in parts[j]:
                            yield tasks.to_batch(tasks.run_local(t, max_entry_size))

            # range() puts id j alone in partition j, built in the JVM (a Python
            # RDD would cost another Python stage per job).
            ids = self.spark.range(0, len(parts), 1, len(parts))
            out = ids.mapInArrow(run_part, schema)
        else:
            by_key: dict[str, list[tasks.FileTask]] = {}
            for t in todo:
                by_key.setdefault(inputs.path_key(t.info.path), []).append(t)

            def run_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for batch in batches:
                    paths = batch.column(0)
                    content = batch.column(1)
                    for i in range(batch.num_rows):
                        for t in by_key[inputs.path_key(paths[i].as_py())]:
                            yield tasks.to_batch(
                                tasks.run_task(t, content[i].as_buffer(), max_entry_size))

            raw = (self.spark.read.format("binaryFile")
                   .load(sorted({t.info.path for t in todo})).select("path", "content"))
            out = raw.mapInArrow(run_rows, schema)
        return tasks.from_table(out.toArrow().cast(tasks.RESULT_SCHEMA))

    def close(self) -> None:
        pass


class SparkFlow:
    """``flow.Flow`` on Spark: ``mapInArrow`` over the files, then
    ``groupBy("space", "gid", "chunk").applyInArrow`` per key, then ``toArrow``.

    Local files (paths every executor can open: one machine, or a shared
    file system) are dealt by estimated cost into partitions of a
    ``spark.range`` and opened by the task (memory-mapped); other URIs are
    read by Spark's ``binaryFile`` source. What is collected is the reduce
    calls' outputs only.
    """

    def __init__(self, spark: SparkSession, partitions: int) -> None:
        self.spark = spark
        self.partitions = partitions

    def run(self, items: list[Any], map_fn: flow.MapFn, reduce_fn: flow.ReduceFn,
            cost: Callable[[Any], float]) -> list[flow.Output]:
        if not items:
            return []
        red = flow.reduce_or_pass(reduce_fn)

        def reducer(table: pa.Table) -> pa.Table:
            blocks = flow.table_to_blocks(table)
            key = blocks[0].key
            return pa.Table.from_pydict({"space": [key[0]], "gid": [key[1]], "chunk": [key[2]],
                                         "data": [red(key, blocks)]}, schema=flow.OUT_SCHEMA)

        local = [it for it in items if it.info is None or inputs.is_local(it.info.path)]
        remote = [it for it in items if it not in local]
        frames = []
        if local:
            parts = flow.balance(local, self.partitions, cost)

            def run_part(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for batch in batches:
                    for j in batch.column(0).to_pylist():
                        for it in parts[j]:
                            blocks = list(flow.map_local(it, map_fn))
                            if blocks:
                                yield flow.blocks_to_batch(blocks)

            frames.append(self.spark.range(0, len(parts), 1, len(parts)).mapInArrow(
                run_part, _spark_schema(flow.BLOCK_SCHEMA)))
        if remote:
            by_key: dict[str, list[Any]] = {}
            for it in remote:
                by_key.setdefault(inputs.path_key(it.info.path), []).append(it)

            def run_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for batch in batches:
                    paths, content = batch.column(0), batch.column(1)
                    for i in range(batch.num_rows):
                        for it in by_key[inputs.path_key(paths[i].as_py())]:
                            blocks = list(map_fn(it, content[i].as_buffer()))
                            if blocks:
                                yield flow.blocks_to_batch(blocks)

            raw = (self.spark.read.format("binaryFile")
                   .load(sorted({it.info.path for it in remote})).select("path", "content"))
            frames.append(raw.mapInArrow(run_rows, _spark_schema(flow.BLOCK_SCHEMA)))
        df = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
        out = (df.groupBy("space", "gid", "chunk")
               .applyInArrow(reducer, _spark_schema(flow.OUT_SCHEMA)).toArrow())
        space, gid, chunk = (out.column(n).to_pylist() for n in ("space", "gid", "chunk"))
        data = out.column("data")
        return [((space[i], gid[i], chunk[i]), data[i].as_buffer().to_pybytes())
                for i in range(out.num_rows)]
