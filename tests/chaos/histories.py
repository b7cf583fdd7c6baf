"""Hand-built histories for the checker tests: a tiny DSL over chaos.history.History."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from chaos.history import History, Op

GROUP, TOPIC = "g", "t"


class Builder:
    def __init__(self) -> None:
        self.h = History()
        self.t = 1_000_000_000_000

    def _tick(self) -> int:
        self.t += 10_000_000
        return self.t

    def send(self, process: int, value: int, outcome: str = "ok", *, queue: int = 0,
             offset: int | None = None, attempts: int = 1, producer: int = 1,
             body_crc: int | None = None) -> None:
        base = {"topic": TOPIC, "value": value, "producer_id": producer, "sequence": value}
        if body_crc is not None:
            base["body_crc32c"] = body_crc
        self.h.record(process, "invoke", "send", base, time_ns=self._tick())
        done = dict(base, attempts=attempts)
        if outcome == "ok":
            done.update(group=GROUP, queue=queue, offset=offset)
        self.h.record(process, outcome, "send", done, time_ns=self._tick(),
                      error=None if outcome == "ok" else "boom")

    def poll(self, process: int | str, messages: list[tuple[int, int, int]], *,
             epoch: int = 0, drain: bool = False, identity: dict[int, tuple[int, int]] | None
             = None, body_crc: dict[int, int] | None = None) -> None:
        """messages: (value, queue, offset); `identity` maps a value to the (producer,
        sequence) the read record carries, `body_crc` to the CRC of the body read."""
        out = []
        for v, q, o in messages:
            m = {"group": GROUP, "topic": TOPIC, "queue": q, "offset": o, "value": v}
            if identity and v in identity:
                m["producer_id"], m["sequence"] = identity[v]
            if body_crc and v in body_crc:
                m["body_crc32c"] = body_crc[v]
            out.append(m)
        self.h.record(process, "ok", "poll", {"epoch": epoch, "drain": drain, "messages": out},
                      time_ns=self._tick())

    def moved(self, process: int | str, queue: int, start: int, to: int, *,
              drain: bool = False) -> None:
        """The reader was answered "moved forward": [start, to) of `queue` deleted."""
        self.h.record(process, "ok", "moved", {"topic": TOPIC, "group": GROUP, "queue": queue,
                                               "from": start, "to": to, "min_offset": to,
                                               "drain": drain}, time_ns=self._tick())

    def nemesis(self, f: str, name: str) -> None:
        self.h.record("nemesis", "info", f, {"nemesis": name}, time_ns=self._tick())

    @property
    def ops(self):
        return self.h.ops


# A history recorded from real processes (bench/audit_corruption.py --record:
# 3 brokers on loopback, flush=sync, replicate=sync, the leader SIGKILLed and
# restarted half-way), packed with the replicas' data directories.
REAL_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "real-run-3n.tar.gz"


def real_history() -> list[Op]:
    """A fresh copy of the recorded real run's history (callers mutate it)."""
    with tarfile.open(REAL_RUN) as tar:
        member = tar.extractfile("history.jsonl")
        assert member is not None
        lines = member.read().decode().splitlines()
    return [Op.from_json(json.loads(line)) for line in lines if line.strip()]
