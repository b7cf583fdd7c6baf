"""chaos.retention: the settings a retention run gives the brokers, and the
evidence it reports (status samples summed over restarts, segments gone)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from chaos.retention import (
    RetentionMonitor,
    RetentionSpec,
    disk_evidence,
    retention_problems,
    summarize,
)
from ledgermq.broker.config import BrokerConfig


def test_the_settings_are_broker_keys_and_must_delete_something() -> None:
    spec = RetentionSpec()
    fields = {f.name for f in dataclasses.fields(BrokerConfig)}
    assert set(spec.broker_config()) <= fields
    assert spec.retention_bytes < 4 * spec.segment_size_bytes  # a few segments kept
    for bad in ({"retention_bytes": 0}, {"segment_size_bytes": 1024},
                {"snapshot_interval_bytes": 0, "snapshot_interval_entries": 0}):
        with pytest.raises(ValueError):
            RetentionSpec(**bad)


def status(first: int, snapshot: int, installs: int, written: int) -> dict:
    return {"first_index": first, "snapshot_index": snapshot, "installs_received": installs,
            "snapshots": {"written": written}}


def test_the_monitor_sums_counters_over_restarts_and_tracks_the_first_index() -> None:
    answers = {"a": [status(1, 0, 0, 0), status(40, 90, 0, 3), None,  # killed
                     status(120, 150, 1, 0), status(160, 200, 1, 2)],   # restarted
               "b": [status(1, 0, 0, 0)] * 5}

    async def status_of(address: str) -> dict | None:
        return answers[address].pop(0)

    async def go() -> RetentionMonitor:
        monitor = RetentionMonitor({1: "a", 2: "b"}, status_of)
        for _ in range(5):
            await monitor.sample()
        return monitor

    seen = asyncio.run(go()).to_json()
    one = seen["1"]
    assert (one["samples"], one["answered"]) == (5, 4)
    assert (one["first_index_first"], one["first_index_last"], one["first_index_max"]) == \
        (1, 160, 160)
    assert one["first_index_moves"] == 3
    assert one["installs_received"] == 1
    assert one["snapshots_written"] == 5  # 3 before the restart, 2 after
    assert one["snapshot_index_max"] == 200
    assert [row[1] for row in one["timeline"]] == [1, 40, 120, 160]
    assert seen["2"]["first_index_moves"] == 0 and len(seen["2"]["timeline"]) == 1


def test_disk_evidence_and_the_verdict(tmp_path) -> None:
    segment = 4096
    for node, bases in {1: [3 * segment, 4 * segment], 2: [0, segment]}.items():
        log = tmp_path / f"n{node}" / "commitlog"
        log.mkdir(parents=True)
        for base in bases:
            (log / f"{base:020d}").write_bytes(b"x" * 100)
            (log / f"{base:020d}.durable").write_text("100\n")  # not a segment
    disk = disk_evidence({1: tmp_path / "n1", 2: tmp_path / "n2"}, segment)
    assert disk["1"] == {"segments": 2, "first_base": 3 * segment, "segments_gone": 3,
                         "bytes": 200}
    assert disk["2"]["segments_gone"] == 0
    summary = summarize(RetentionSpec(), {"1": {"installs_received": 1},
                                          "2": {"installs_received": 0}}, disk)
    assert summary["segments_deleted"] == 3 and summary["nodes_with_deletions"] == [1]
    assert summary["installs"] == 1 and summary["nodes_installed"] == [1]
    assert retention_problems(summary) == []
    nothing = summarize(RetentionSpec(), None, {"2": disk["2"]})
    assert retention_problems(nothing) and "no segment" in retention_problems(nothing)[0]
