"""History files round-trip; stats and the report come out of a history alone."""

from __future__ import annotations

import json

from chaos.history import History, read_history
from chaos.report import write_report
from chaos.stats import fault_windows, latencies, throughput, unavailability
from tests.chaos.histories import Builder


def test_history_file_is_the_audit_format(tmp_path) -> None:
    path = tmp_path / "history.jsonl"
    with History(path) as h:
        h.record(3, "invoke", "send", {"topic": "t", "value": 1, "producer_id": 5, "sequence": 1})
        h.record(3, "ok", "send", {"topic": "t", "queue": 2, "producer_id": 5, "sequence": 1,
                                   "offset": 41, "msg_id": "g1@00", "group": "g1", "value": 1})
        h.record("nemesis", "info", "start", {"nemesis": "kill"})
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["index"] for line in lines] == [0, 1, 2]
    assert set(lines[1]) == {"index", "time_ns", "process", "type", "f", "value"}
    assert lines[1]["value"]["offset"] == 41 and lines[2]["process"] == "nemesis"
    ops = read_history(path)
    assert [op.type for op in ops] == ["invoke", "ok", "info"]


def test_a_torn_last_line_is_ignored(tmp_path) -> None:
    path = tmp_path / "history.jsonl"
    with History(path) as h:
        h.record(1, "invoke", "send", {"value": 1})
    with open(path, "a") as fh:
        fh.write('{"index": 1, "ti')
    assert len(read_history(path)) == 1


def outage() -> Builder:
    b = Builder()
    for i in range(5):
        b.send(1, i, queue=0, offset=i)
    b.nemesis("start", "partition-halves")
    b.t += 3_000_000_000  # three seconds without an ack
    b.send(1, 5, "info")
    b.nemesis("stop", "partition-halves")
    for i in range(6, 9):
        b.send(1, i, queue=0, offset=i - 1)
    return b


def test_unavailability_is_tied_to_the_fault() -> None:
    ops = outage().ops
    windows = fault_windows(ops)
    assert [w.name for w in windows] == ["partition-halves"] and windows[0].end is not None
    avail = unavailability(ops)
    assert avail["longest_s"] >= 3.0
    assert avail["gaps"][0]["faults"] == ["partition-halves"]
    assert avail["per_fault"][0]["unavailable_s"] >= 3.0
    assert {p.type for p in latencies(ops)} == {"ok", "info"}
    assert sum(r for _, r in throughput(ops)["ok"]) == 8


def test_report_files(tmp_path) -> None:
    ops = outage().ops
    write_report(ops, {"checker": {"valid": True, "counts": {"lost": 0}},
                       "availability": unavailability(ops), "run": {"nodes": 3}}, tmp_path)
    for name in ("results.json", "latency.png", "rate.png", "index.html"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "latency.png").read_bytes()[:4] == b"\x89PNG"
    page = (tmp_path / "index.html").read_text()
    assert "VALID" in page and "partition-halves" in page
