"""Hand-built histories for the checker tests: a tiny DSL over chaos.history.History."""

from __future__ import annotations

from chaos.history import History

GROUP, TOPIC = "g", "t"


class Builder:
    def __init__(self) -> None:
        self.h = History()
        self.t = 1_000_000_000_000

    def _tick(self) -> int:
        self.t += 10_000_000
        return self.t

    def send(self, process: int, value: int, outcome: str = "ok", *, queue: int = 0,
             offset: int | None = None, attempts: int = 1, producer: int = 1) -> None:
        base = {"topic": TOPIC, "value": value, "producer_id": producer, "sequence": value}
        self.h.record(process, "invoke", "send", base, time_ns=self._tick())
        done = dict(base, attempts=attempts)
        if outcome == "ok":
            done.update(group=GROUP, queue=queue, offset=offset)
        self.h.record(process, outcome, "send", done, time_ns=self._tick(),
                      error=None if outcome == "ok" else "boom")

    def poll(self, process: int | str, messages: list[tuple[int, int, int]], *,
             epoch: int = 0, drain: bool = False) -> None:
        """messages: (value, queue, offset)."""
        self.h.record(process, "ok", "poll", {
            "epoch": epoch, "drain": drain,
            "messages": [{"group": GROUP, "topic": TOPIC, "queue": q, "offset": o, "value": v}
                         for v, q, o in messages]}, time_ns=self._tick())

    def nemesis(self, f: str, name: str) -> None:
        self.h.record("nemesis", "info", f, {"nemesis": name}, time_ns=self._tick())

    @property
    def ops(self):
        return self.h.ops
