"""Short chaos runs with retention deleting segments while the faults run.

Real clusters (NameServer + 3 brokers in a private network namespace) with
32 KiB segments, 64 KiB of retention and a snapshot every 16 KiB of log, at
100 sends/s: the log's start moves every few seconds. The sync run must lose
nothing that was still inside retention when the drain read, count what was
outside it as expired, show deletions on every node, and bring the killed
leader back by snapshot install. The bite shows that expiry never hides a
loss: replicate=async with the leader cut off still loses acknowledged
messages, and the checker still says so. Waits are deadlines on conditions.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chaos.retention import RetentionSpec
from chaos.runner import RunConfig, run
from chaos.schedule import Schedule
from tests.chaos.test_runs import needs_netns

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]


def nemesis_targets(run_dir, name: str, key: str) -> set[int]:
    """Nodes a nemesis acted on, from the history's start details."""
    found: set[int] = set()
    for line in (run_dir / "history.jsonl").read_text().splitlines():
        op = json.loads(line)
        if op["process"] == "nemesis" and op["f"] == "start" and op["type"] == "info" \
                and op["value"].get("nemesis") == name:
            found |= set(op["value"].get("detail", {}).get(key, []))
    return found


def test_kill_leader_with_retention_through_the_cli(tmp_path) -> None:
    needs_netns()
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "ledgermq.cli", "chaos", "run", "--nemesis", "kill-leader",
         "--time-limit", "20", "--rate", "100", "--on", "8", "--off", "4", "--seed", "5",
         "--retention-bytes", "65536", "--segment-size-bytes", "32768", "--out", str(out)],
        capture_output=True, text=True, timeout=380)
    results = json.loads((out / "results.json").read_text())
    check = results["checker"]
    assert proc.returncode == 0, (results["invalid_because"], proc.stderr[-3000:])
    assert "retention:" in proc.stdout and "segments deleted" in proc.stdout
    counts = check["counts"]
    assert check["sends"]["acknowledged"] > 1000
    assert counts["lost"] == 0 and counts["expired_unknown"] == 0
    assert counts["expired"] > 0 and check["retention"]["drain_moves"] > 0
    kept = results["retention"]
    assert kept["settings"]["retention_bytes"] == 65536
    assert kept["nodes_with_deletions"] == [1, 2, 3]
    assert all(node["disk"]["segments_gone"] > 0 for node in kept["nodes"].values())
    # The leader killed for 8 s came back behind the group's first index and
    # rejoined by snapshot install.
    killed = nemesis_targets(out, "kill-leader", "killed")
    assert killed and killed & set(kept["nodes_installed"]), kept["nodes_installed"]


def test_expiry_never_hides_a_loss(tmp_path) -> None:
    """replicate=async, the leader isolated: its acknowledged messages are
    lost, retention or not; the checker reports them as lost, not expired."""
    needs_netns()
    results = run(RunConfig(out=tmp_path / "bite", nemesis="partition-leader", time_limit=20,
                            rate=80, flush="async", replicate="async", seed=3,
                            schedule=Schedule("fixed", 6, 4), log_level="WARNING",
                            retention=RetentionSpec()), log=lambda _m: None)
    counts = results["checker"]["counts"]
    assert "lost" in results["checker"]["bad_kinds"] and counts["lost"] > 0
    assert counts["expired"] > 0
    assert results["retention"]["nodes_with_deletions"]
