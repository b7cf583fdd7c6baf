"""The Spark engine: the same parsers and checks, distributed.

- Bulk files are parsed by ``mapInArrow``, one file per row, so the work is
  partitioned by segment. Local files are opened by the Python task itself
  (a DataFrame of paths, one partition per file); other URIs are read with
  Spark's ``binaryFile`` source, which refuses files over 2 GB (segments of
  256 MiB by default, or RocketMQ's 1 GiB, fit). The parse output is one cached DataFrame in a
  union schema (``rec`` says which table a row belongs to).
- The compact tables (entries, index records, problems: about 60 bytes an
  entry) are collected: the cross-replica log checks need every replica's
  entries of a group side by side and run on the driver in numpy.
- Messages and ConsumeQueue units stay distributed: ``check_queue`` runs per
  (group, topic, queue) through ``cogroup().applyInArrow``; duplicate client
  ids per hash bucket through ``groupBy().applyInArrow``; history keys are a
  broadcast join.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from spark_audit import checks, engine, inputs, parse
from spark_audit.engine import Parsed
from spark_audit.inputs import FileInfo

REC = {"entries": 0, "messages": 1, "index": 2, "cq": 3, "problems": 4}


def _union_schema() -> pa.Schema:
    fields: dict[str, pa.DataType] = {"rec": pa.int8()}
    for schema in parse.TABLES.values():
        for f in schema:
            if f.name in fields and fields[f.name] != f.type:
                raise TypeError(f"column {f.name} has two types")
            fields[f.name] = f.type
    return pa.schema(list(fields.items()))


UNION = _union_schema()


def to_union(name: str, table: pa.Table) -> pa.RecordBatch:
    """A batch in the union schema: the table's columns, nulls elsewhere."""
    n = table.num_rows
    cols = []
    for f in UNION:
        if f.name == "rec":
            cols.append(pa.array([REC[name]] * n, pa.int8()))
        elif f.name in table.column_names:
            cols.append(table.column(f.name).combine_chunks())
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=UNION)


def _spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


class SparkEngine:
    """Runs the audit on a SparkSession (local[*] or a cluster)."""

    name = "spark"

    def __init__(self, spark, dup_buckets: int | None = None) -> None:
        self.spark = spark
        self.dup_buckets = dup_buckets or max(2, spark.sparkContext.defaultParallelism)
        self._parsed = None
        self.lister = inputs.Lister(self._list)

    def _list(self, path: str) -> list[tuple[str, bool, int]]:
        if inputs.is_local(path):
            return inputs.LOCAL.children(path)
        jvm = self.spark._jvm
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

    def parse(self, files: list[FileInfo], max_entry_size: int) -> Parsed:
        t0 = time.perf_counter()
        if not files:
            empty = {k: s.empty_table() for k, s in parse.TABLES.items()}
            return Parsed(empty["entries"], empty["index"], empty["problems"],
                          {k: 0 for k in parse.TABLES}, 0.0)
        by_key = {inputs.path_key(f.path): f for f in files}

        def parse_batches(batches):
            for batch in batches:
                paths = batch.column(0)
                content = batch.column(1)
                for i in range(batch.num_rows):
                    info = by_key[inputs.path_key(paths[i].as_py())]
                    buf = content[i].as_buffer()
                    for name, t in engine.parse_file(info, buf, max_entry_size).items():
                        if t.num_rows:
                            yield to_union(name, t)

        def parse_local(batches):
            for batch in batches:
                for path in batch.column(0).to_pylist():
                    info = by_key[inputs.path_key(path)]
                    buf = np.fromfile(inputs.local_path(path), dtype=np.uint8)
                    for name, t in engine.parse_file(info, memoryview(buf),
                                                     max_entry_size).items():
                        if t.num_rows:
                            yield to_union(name, t)

        if all(inputs.is_local(f.path) for f in files):
            # Local files: each task opens its file itself, so bytes never pass
            # through the JVM (no heap copies, no 2 GB limit). Files are dealt
            # round-robin by size into a few partitions per core, so partitions
            # carry similar bytes and tiny files do not each cost a task.
            order = sorted(files, key=lambda f: -f.length)
            k = min(len(order), 4 * self.spark.sparkContext.defaultParallelism)
            dealt = [f for j in range(k) for f in order[j::k]]
            sizes = [len(order[j::k]) for j in range(k)]
            # parallelize() cuts contiguous slices of equal count; glom() keeps them.
            rdd = self.spark.sparkContext.parallelize(
                [(f.path,) for f in dealt], numSlices=k) if len(set(sizes)) == 1 else (
                self.spark.sparkContext.parallelize(list(range(k)), numSlices=k)
                .flatMap(lambda j, order=order, k=k: [(f.path,) for f in order[j::k]]))
            raw = self.spark.createDataFrame(rdd, "path string")
            parsed = raw.mapInArrow(parse_local, _spark_schema(UNION)).cache()
        else:
            raw = (self.spark.read.format("binaryFile").load([f.path for f in files])
                   .select("path", "content"))
            parsed = raw.mapInArrow(parse_batches, _spark_schema(UNION)).cache()
        self._parsed = parsed
        from pyspark.sql import functions as F

        counts = {name: 0 for name in REC}
        for row in parsed.groupBy("rec").count().collect():
            counts[next(k for k, v in REC.items() if v == row["rec"])] = row["count"]
        t_parse = time.perf_counter() - t0

        def collect(name: str) -> pa.Table:
            cols = parse.TABLES[name].names
            t = parsed.where(F.col("rec") == REC[name]).select(*cols).toArrow()
            return t.cast(parse.TABLES[name])

        entries, index, problems = collect("entries"), collect("index"), collect("problems")
        p = Parsed(entries, index, problems, counts, time.perf_counter() - t0)
        p.counts["parse_job_s"] = round(t_parse, 3)
        return p

    def _table(self, name: str):
        from pyspark.sql import functions as F

        return self._parsed.where(F.col("rec") == REC[name]).select(*parse.TABLES[name].names)

    def queue_findings(self, ctxs: dict[int, checks.QueueContext], max_examples: int):
        def per_queue(left: pa.Table, right: pa.Table) -> pa.Table:
            src = left if left.num_rows else right
            gid = src.column("gid")[0].as_py()
            if gid not in ctxs:
                return checks.FINDING_SCHEMA.empty_table()
            return checks.check_queue(left.cast(parse.MESSAGE_SCHEMA),
                                      right.cast(parse.CQ_SCHEMA), ctxs[gid], max_examples)

        keys = engine.QUEUE_KEYS
        out = (self._table("messages").groupBy(*keys)
               .cogroup(self._table("cq").groupBy(*keys))
               .applyInArrow(per_queue, _spark_schema(checks.FINDING_SCHEMA)))
        return out.toArrow().cast(checks.FINDING_SCHEMA)

    def _committed_messages(self, sources):
        def keep(batches):
            for b in batches:
                t = pa.Table.from_batches([b])
                yield from engine.source_filter(t, sources).to_batches()

        return self._table("messages").mapInArrow(keep, _spark_schema(parse.MESSAGE_SCHEMA))

    def duplicate_findings(self, sources, max_examples: int):
        from pyspark.sql import functions as F

        msgs = self._committed_messages(sources).where(F.col("producer_id") != 0)
        bucket = F.pmod(F.xxhash64("producer_id", "sequence"), F.lit(self.dup_buckets))

        def per_bucket(t: pa.Table) -> pa.Table:
            return checks.find_duplicate_ids(t.cast(parse.MESSAGE_SCHEMA), max_examples)

        out = (msgs.withColumn("bucket", bucket).groupBy("gid", "bucket")
               .applyInArrow(lambda t: per_bucket(t.drop_columns(["bucket"])),
                             _spark_schema(checks.FINDING_SCHEMA)))
        return out.toArrow().cast(checks.FINDING_SCHEMA)

    def lookup(self, keys: pa.Table, sources) -> pa.Table:
        from pyspark.sql import functions as F

        cols = ["gid", "producer_id", "sequence", "phys_offset"]
        if not keys.num_rows:
            return keys.select(cols)
        msgs = self._committed_messages(sources).select(*cols)
        k = self.spark.createDataFrame(keys.to_pandas())
        by_id = msgs.join(F.broadcast(k.where(F.col("producer_id") != 0)
                                      .select("gid", "producer_id", "sequence").distinct()),
                          ["gid", "producer_id", "sequence"])
        by_off = msgs.join(F.broadcast(k.where(F.col("phys_offset") >= 0)
                                       .select("gid", "phys_offset").distinct()),
                           ["gid", "phys_offset"])
        both = by_id.select(*cols).unionByName(by_off.select(*cols)).distinct()
        return both.toArrow()

    def close(self) -> None:
        if self._parsed is not None:
            self._parsed.unpersist()
            self._parsed = None
