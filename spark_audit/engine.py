"""Where file tasks run: in this process, or (``spark_engine``) over Spark.

An engine does three things and knows nothing about the checks:

- ``lister``: lists directories (local, or through Hadoop for the Spark engine);
- ``read_small``: the few-byte files (checkpoint, hardstate, dispatch checkpoint,
  snapshot metas, identity);
- ``read_range``: a few bytes of a bulk file (an entry header, a Raft-index
  record), which is how the driver finds where a cut or window lies (``window``);
- ``run_tasks``: ``tasks.run_task`` over a list of ``FileTask``, returning one
  ``FileResult`` per task (in any order; results carry their task id).

Everything else (``audit.run_audit``) runs on the driver over the compact
results, so the two engines produce identical findings.
"""

from __future__ import annotations

from typing import Protocol

from spark_audit import flow, fmt, inputs, tasks
from spark_audit.inputs import FileInfo


class Engine(Protocol):
    """What ``audit.run_audit`` needs of an engine."""

    name: str
    lister: inputs.Lister

    def read_small(self, files: list[FileInfo]) -> dict[int, bytes]: ...

    def read_range(self, path: str, offset: int, length: int) -> bytes: ...

    def run_tasks(self, todo: list[tasks.FileTask], max_entry_size: int
                  ) -> list[tasks.FileResult]: ...

    def close(self) -> None: ...


class LocalEngine:
    """Everything in this process: the fast path for one machine and for tests."""

    name = "python"

    def __init__(self) -> None:
        self.lister = inputs.LOCAL

    def read_small(self, files: list[FileInfo]) -> dict[int, bytes]:
        out = {}
        for f in files:
            with open(inputs.local_path(f.path), "rb") as fh:
                out[f.fid] = fh.read()
        return out

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        return tasks.read_local_range(path, offset, length)

    def run_tasks(self, todo: list[tasks.FileTask], max_entry_size: int
                  ) -> list[tasks.FileResult]:
        return [tasks.run_local(t, max_entry_size) for t in todo]

    def close(self) -> None:
        pass


def decode_small(kind: str, data: bytes
                 ) -> (fmt.Checkpoint | fmt.HardState | fmt.DispatchCheckpoint | fmt.SnapshotMeta
                       | fmt.Identity):
    """Parse a small file by kind (raises ``fmt.FormatError``)."""
    if kind == inputs.CHECKPOINT:
        return fmt.parse_checkpoint(data)
    if kind == inputs.HARDSTATE:
        return fmt.parse_hardstate(data)
    if kind == inputs.IDENTITY:
        return fmt.parse_identity(data)
    if kind == inputs.SNAPSHOT_META:
        return fmt.parse_snapshot_meta(data)
    return fmt.parse_dispatch_checkpoint(data)


class LocalFlowEngine(LocalEngine):
    """The distributed audit (``distributed``) with its map and reduce calls run in this
    process: what the Spark engine computes, without a JVM (tests, small data)."""

    name = "python-flow"

    def __init__(self) -> None:
        super().__init__()
        self.flow = flow.LocalFlow()
