"""The history of a chaos run: every client and nemesis operation, in order.

One JSON object per line, exactly the format docs/audit.md reads:

    {"index": 7, "time_ns": ..., "process": 3, "type": "ok", "f": "send",
     "value": {"topic": ..., "queue": 2, "producer_id": ..., "sequence": 9,
               "offset": 41, "msg_id": "g1@...", "group": "g1", "value": 1234}}

`type` is `invoke`, `ok` (it happened), `fail` (it certainly did not happen)
or `info` (unknown: it may or may not have happened). Client processes are
integers; nemesis operations use the process "nemesis" (f "start"/"stop")
and share the stream so plots can shade fault periods. `time_ns` is wall
clock (shared by every process on the machine); `index` is the order in
which the harness recorded the operations.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

TYPES = ("invoke", "ok", "fail", "info")
NEMESIS = "nemesis"


@dataclass
class Op:
    """One history line."""

    process: int | str
    type: str
    f: str
    value: Any = None
    time_ns: int = 0
    index: int = -1
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "time_ns": self.time_ns,
                               "process": self.process, "type": self.type, "f": self.f,
                               "value": self.value}
        if self.error is not None:
            out["error"] = self.error
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Op:
        known = {"index", "time_ns", "process", "type", "f", "value", "error"}
        if raw.get("type") not in TYPES:
            raise ValueError(f"history line {raw.get('index')}: bad type {raw.get('type')!r}")
        return cls(process=raw["process"], type=raw["type"], f=raw["f"],
                   value=raw.get("value"), time_ns=int(raw.get("time_ns", 0)),
                   index=int(raw.get("index", -1)), error=raw.get("error"),
                   extra={k: v for k, v in raw.items() if k not in known})

    @property
    def is_nemesis(self) -> bool:
        return self.process == NEMESIS


class History:
    """A thread-safe, append-only recorder; optionally streams every op to a file.

    Streaming (one flush per line) means a run that dies half-way still leaves
    the history up to that point for the checker and the audit.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.ops: list[Op] = []
        self._lock = threading.Lock()
        self._file: TextIO | None = open(path, "w") if path is not None else None  # noqa: SIM115

    def record(self, process: int | str, type_: str, f: str, value: Any = None,
               error: str | None = None, time_ns: int | None = None) -> Op:
        if type_ not in TYPES:
            raise ValueError(f"bad op type {type_!r}")
        with self._lock:
            op = Op(process, type_, f, value, time_ns if time_ns is not None else time.time_ns(),
                    len(self.ops), error)
            self.ops.append(op)
            if self._file is not None:
                self._file.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")
                self._file.flush()
        return op

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_history(ops: Iterable[Op], path: str | Path) -> None:
    """Write ops as JSON Lines (indexes renumbered in the given order)."""
    with open(path, "w") as fh:
        for i, op in enumerate(ops):
            op.index = i
            fh.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")


def read_history(path: str | Path) -> list[Op]:
    """Parse a history file; a truncated last line (a killed run) is ignored."""
    return list(iter_history(path))


def iter_history(path: str | Path) -> Iterator[Op]:
    with open(path) as fh:
        lines = fh.read().split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError:
            if number >= len(lines) - 1:
                return  # torn final line of an interrupted run
            raise ValueError(f"{path}:{number}: not JSON") from None
        yield Op.from_json(raw)


def pairs(ops: Iterable[Op], orphans: list[Op] | None = None
          ) -> Iterator[tuple[Op, Op | None]]:
    """Each invoke with its completion by the same process (None if it never completed).

    Client processes run one operation at a time, so an invoke's completion is
    the next op of that process. A completion with no invoke open on its
    process pairs with nothing; it goes to `orphans` (when given), so that a
    checker can say the history is inconsistent rather than drop it.
    """
    open_ops: dict[int | str, Op] = {}
    order: list[Op] = []
    done: dict[int, Op | None] = {}
    for op in ops:
        if op.type == "invoke":
            if op.process in open_ops:  # an invoke that never completed
                done[id(open_ops[op.process])] = None
            open_ops[op.process] = op
            order.append(op)
        elif op.process in open_ops:
            invoke = open_ops.pop(op.process)
            done[id(invoke)] = op
        elif orphans is not None:
            orphans.append(op)
    for invoke in order:
        yield invoke, done.get(id(invoke))
