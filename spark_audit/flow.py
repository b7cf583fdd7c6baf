"""Keyed blocks: how the distributed audit moves rows between map and reduce tasks.

A *map* call reads one file (or emits the history's keys) and yields
``Block`` values: the rows of one numpy structured array (per-entry rows,
per-record rows, per-unit rows) that belong to one key ``(space, gid,
chunk)`` — a range of Raft indexes, of log positions, of queue slots or a
bucket of client identities of one group — packed as one binary value
(``tasks.pack``: columns, delta-coded, zstd). A *reduce* call receives every
block of one key, from every replica and file, compares them and returns a
small msgpack value: findings, counts, runs. The driver only sees those.

``SparkFlow`` (``spark_engine``) runs this as ``mapInArrow`` over the files,
then ``groupBy("space", "gid", "chunk").applyInArrow``; ``LocalFlow`` runs
the very same functions in this process, grouping blocks in a dict. Rows
travel in blocks rather than as one Spark row each because Spark's per-row
cost (Arrow to rows, shuffle, rows to Arrow) measured ~12 s for 6 million
rows on ``local[2]`` (about 4 µs of CPU per row), several times the whole
audit's budget per entry; a block of a few hundred thousand rows costs the
shuffle one row.

Summaries (per-file results the driver needs: problems, first and last
entries, CRCs) are blocks of space ``SUMMARY`` whose reduce is the identity.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgpack
import numpy as np
import pyarrow as pa

from spark_audit import tasks

# Key spaces.
SUMMARY, LOG, OFFSET, SLOT, IDS = 0, 1, 2, 3, 4

BLOCK_SCHEMA = pa.schema([
    ("space", pa.int8()), ("gid", pa.int32()), ("chunk", pa.int64()), ("rid", pa.int32()),
    ("what", pa.int8()), ("data", pa.binary()),
])
OUT_SCHEMA = pa.schema([("space", pa.int8()), ("gid", pa.int32()), ("chunk", pa.int64()),
                        ("data", pa.binary())])

Key = tuple[int, int, int]
T = TypeVar("T")


@dataclass(frozen=True)
class Block:
    """The rows of one key produced by one map call (``data``: packed rows or msgpack)."""

    space: int
    gid: int
    chunk: int
    rid: int
    what: int
    data: bytes

    @property
    def key(self) -> Key:
        return self.space, self.gid, self.chunk


# A map call gets its item and, when the item names a file, the file's bytes.
MapFn = Callable[[Any, Any], Iterable[Block]]
ReduceFn = Callable[[Key, list[Block]], bytes]
# What a flow returns: the key and output of every reduce call (summaries included).
Output = tuple[Key, bytes]


def summary(gid: int, ident: int, value: object) -> Block:
    """A per-file result for the driver (passes through the reduce unchanged)."""
    return Block(SUMMARY, gid, ident, -1, 0, msgpack.packb(value, use_bin_type=True))


def rows(space: int, gid: int, chunk: int, rid: int, what: int, arr: np.ndarray) -> Block:
    """Rows of a structured array as one block."""
    return Block(space, gid, chunk, rid, what, tasks.pack(arr))


def split_rows(space: int, gid: int, rid: int, what: int, arr: np.ndarray, key: np.ndarray,
               ) -> Iterator[Block]:
    """One block per distinct value of ``key`` (the chunk of each row)."""
    if not len(arr):
        return
    if len(key) and key[0] == key[-1] and (key == key[0]).all():
        yield rows(space, gid, int(key[0]), rid, what, arr)
        return
    order = np.argsort(key, kind="stable")
    k = key[order]
    cuts = np.nonzero(np.diff(k))[0] + 1
    for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(k)]]), strict=True):
        yield rows(space, gid, int(k[a]), rid, what, arr[order[a:b]])


def unpack_rows(blocks: list[Block], what: int, dtype: np.dtype) -> np.ndarray:
    """The rows of every block of kind ``what``, concatenated (block order)."""
    parts = [tasks.unpack(b.data, dtype) for b in blocks if b.what == what]
    if not parts:
        return np.zeros(0, dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def reduce_or_pass(reduce: ReduceFn) -> ReduceFn:
    """``reduce`` for data keys, the identity for summaries."""

    def run(key: Key, blocks: list[Block]) -> bytes:
        if key[0] == SUMMARY:
            return blocks[0].data
        return reduce(key, blocks)

    return run


class Flow(Protocol):
    """Runs a map call per item (an object with ``info``, a ``FileInfo`` or None) and a
    reduce call per key; returns every reduce call's key and output."""

    def run(self, items: list[Any], map_fn: MapFn, reduce_fn: ReduceFn,
            cost: Callable[[Any], float]) -> list[Output]: ...


def map_local(item: Any, map_fn: MapFn) -> Iterator[Block]:
    """``map_fn`` over an item whose file (if any) is local: read memory-mapped."""
    if item.info is None:
        yield from map_fn(item, None)
        return
    buf = tasks.read_file(item.info)
    try:
        yield from map_fn(item, buf)
    finally:
        if hasattr(buf, "close"):
            with contextlib.suppress(BufferError):  # a view still alive keeps it open
                buf.close()


class LocalFlow:
    """The flow in this process: the same map and reduce functions, a dict for the shuffle."""

    def run(self, items: list[Any], map_fn: MapFn, reduce_fn: ReduceFn,
            cost: Callable[[Any], float]) -> list[Output]:
        by_key: dict[Key, list[Block]] = defaultdict(list)
        for item in items:
            for b in map_local(item, map_fn):
                by_key[b.key].append(b)
        red = reduce_or_pass(reduce_fn)
        return [(k, red(k, bs)) for k, bs in by_key.items()]


def blocks_to_batch(blocks: list[Block]) -> pa.RecordBatch:
    """Blocks as rows of ``BLOCK_SCHEMA``."""
    return pa.RecordBatch.from_arrays([
        pa.array([b.space for b in blocks], pa.int8()),
        pa.array([b.gid for b in blocks], pa.int32()),
        pa.array([b.chunk for b in blocks], pa.int64()),
        pa.array([b.rid for b in blocks], pa.int32()),
        pa.array([b.what for b in blocks], pa.int8()),
        pa.array([b.data for b in blocks], pa.binary()),
    ], schema=BLOCK_SCHEMA)


def table_to_blocks(table: pa.Table) -> list[Block]:
    """Inverse of ``blocks_to_batch`` over a table (any number of batches)."""
    out = []
    for batch in table.to_batches():
        cols = [batch.column(i) for i in range(6)]
        for i in range(batch.num_rows):
            out.append(Block(cols[0][i].as_py(), cols[1][i].as_py(), cols[2][i].as_py(),
                             cols[3][i].as_py(), cols[4][i].as_py(),
                             cols[5][i].as_buffer().to_pybytes()))
    return out


def balance(items: list[T], parts: int, cost: Callable[[T], float]) -> list[list[T]]:
    """Deal items into ``parts`` lists of similar cost, heaviest list first."""
    parts = max(1, min(parts, len(items)))
    load = [0.0] * parts
    out: list[list[T]] = [[] for _ in range(parts)]
    for it in sorted(items, key=lambda t: -cost(t)):
        j = min(range(parts), key=load.__getitem__)
        out[j].append(it)
        load[j] += cost(it)
    return [out[j] for j in sorted(range(parts), key=lambda j: -load[j])]
