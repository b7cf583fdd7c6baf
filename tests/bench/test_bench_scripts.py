"""The benchmarks still run and still print what the docs quote from them.

Figures are evidence only when the scripts that print them work on a clean
checkout, so each one runs here in its shortest form and its JSON is checked
for shape and sense. No figure is compared with a target: speed is the
benchmarks' business, not the tests'.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_bench(*args: str, timeout: float) -> str:
    done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_storage_bench_prints_every_figure(tmp_path: Path) -> None:
    out = run_bench("bench/storage.py", "--quick", "--dir", str(tmp_path), timeout=300)
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    kinds = {(r["bench"], r.get("flush"), r.get("batch"), r.get("appenders")) for r in lines}
    assert ("append", "async", 64, None) in kinds
    assert ("append", "sync", 1, 64) in kinds
    assert any(r["bench"] == "raw_write" for r in lines)
    assert any(r["bench"] == "recovery" for r in lines)
    for api in ("append_new", "append"):
        sync64 = next(r for r in lines if r["bench"] == "append" and r.get("flush") == "sync"
                      and r.get("api") == api and r.get("batch") == 1
                      and r.get("appenders") == 64)
        # Group commit: one fsync covered many appends.
        assert sync64["entries_per_fsync"] > 1
        # Where a round's time goes: fdatasync, hand-offs, and the rest on the loop.
        assert 0 < sync64["fsync_ms"] < sync64["round_ms"]
        assert 0 < sync64["handoff_ms"] < sync64["round_ms"]
        assert sync64["messages_per_s"] > 0
    assert list(tmp_path.iterdir()) == []  # it removed what it wrote


def test_produce_bench_runs_a_cluster_and_reports_cpu_and_failover() -> None:
    """Open, auth and auth+tls clusters in one run (the default), with the
    cost of each secured mode against open. flush=async only (the default runs
    both; the flush only changes the brokers' setting), to keep CI short."""
    out = run_bench("bench/produce.py", "--seconds", "1", "--kills", "1", "--rounds", "1",
                    "--flush", "async",
                    "--loads", "single_64_in_flight,batch_64,batch_64_32_in_flight",
                    timeout=400)
    result = json.loads(out)
    securities = ["open", "auth", "auth+tls"]
    assert result["securities"] == securities
    assert [(run["flush"], run["security"]) for run in result["runs"]] == \
        [("async", security) for security in securities]
    for key in ("async/batch_64", "async/single_64_in_flight"):
        cost = result["cost"][key]
        assert set(cost) == {"auth", "auth+tls"}
        for figures in cost.values():
            assert figures["msgs_per_s_ratio"] > 0
            assert {"client", "leader", "follower_1", "follower_2", "all_processes"} == \
                set(figures["cpu_us_per_msg_added"])
    for run in result["runs"]:
        for mode in ("single_64_in_flight", "batch_64", "batch_64_32_in_flight"):
            figures = run[mode]
            assert figures["acked"] > 0 and figures["msgs_per_s"] > 0
            assert figures["p50_ms"] <= figures["p99_ms"]
            cpu = figures["cpu_us_per_msg"]
            assert {"client", "leader"} <= set(cpu)
            assert {name for name in cpu if name.startswith("follower_")} == \
                {"follower_1", "follower_2"}
            assert all(v > 0 for v in cpu.values()), (run["flush"], run["security"], mode, cpu)
    failover = result["failover"]
    assert failover["kills"] == 1 and len(failover["all_s"]) == 1
    assert 0 < failover["p50_s"] <= failover["max_s"]
    assert result["calibration_s_start"] > 0 and result["calibration_s_end"] > 0


def test_produce_bench_per_message_workload_reports_server_cpu_per_process() -> None:
    """Merging off at W = 1 and 64, independent producer processes, and W = 1
    with the SDK's default merging (as the side-by-side kit sends)."""
    loads = ["nomerge_w1", "nomerge_w64", "procs", "single_1_in_flight"]
    out = run_bench("bench/produce.py", "--seconds", "1", "--kills", "0", "--rounds", "1",
                    "--security", "open", "--flush", "async",
                    "--loads", ",".join(loads), "--procs", "3", timeout=300)
    result = json.loads(out)
    assert result["loads"] == loads
    (run,) = result["runs"]
    for load, client in (("nomerge_w1", "client"), ("nomerge_w64", "client"),
                         ("procs", "clients"), ("single_1_in_flight", "client")):
        figures = run[load]
        assert figures["acked"] > 0 and 0 < figures["p50_ms"] <= figures["p99_ms"]
        cpu = figures["cpu_us_per_msg"]
        assert set(cpu) == {client, "leader", "follower_1", "follower_2", "servers"}
        assert all(v > 0 for v in cpu.values()), (load, cpu)
        assert cpu["servers"] == pytest.approx(
            cpu["leader"] + cpu["follower_1"] + cpu["follower_2"], abs=0.2)
        assert all(0 <= share <= 1 for share in figures["system_share"].values())
    assert "failover" not in result


def test_startup_bench_starts_a_broker_from_a_snapshot_at_two_sizes(tmp_path: Path) -> None:
    out = run_bench("bench/startup.py", "--sizes-mib", "3,6", "--tail-mib", "1",
                    "--segment-mib", "1", "--rounds", "1", "--contrast", "--dir",
                    str(tmp_path), timeout=300)
    result = json.loads(out.splitlines()[-1])
    assert result["bench"] == "startup" and [r["size_mib"] for r in result["runs"]] == [3, 6]
    for figures in result["runs"]:
        assert figures["restored_snapshot_index"] == figures["snapshot_index"] > 0
        # Only the tail after the snapshot is replayed (plus the start's own no-op).
        assert figures["replayed_entries"] <= figures["tail_entries"] + 1
        assert figures["replayed_entries"] < figures["entries"] // 2
        assert 0 < figures["start_s_median"] <= figures["ready_s_median"]
    whole = result["runs"][0]["without_snapshot"]
    assert whole["replayed_entries"] >= result["runs"][0]["entries"]
    assert result["start_ratio_largest_to_smallest"] > 0
    assert list(tmp_path.iterdir()) == []  # it removed what it built


def test_retention_soak_bench_stays_in_budget_moves_a_consumer_and_rejoins_by_install(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    plot, samples = tmp_path / "soak.png", tmp_path / "samples.json"
    out = run_bench("bench/retention_soak.py", "--total-gb", "0.08", "--disk-limit-gb", "0.05",
                    "--segment-mb", "1", "--body-kb", "8", "--snapshot-max-kb", "256",
                    "--settle-s", "1", "--dir", str(data), "--plot", str(plot),
                    "--samples-out", str(samples), timeout=300)
    result = json.loads(out)
    plan = result["budget"]
    # The limit is split, not padded: segments plus every other part.
    assert plan["retention_bytes"] + plan["overhead"] == plan["limit"]
    assert result["retention_bytes"] == plan["retention_bytes"] > 4 * result["segment_bytes"]
    assert result["produced_bytes"] >= result["total_bytes"]
    assert result["leader_first_index"] > 1  # retention deleted the log's head
    peaks = result["peak_while_producing"]
    assert sorted(peaks) == ["n1", "n2", "n3"]
    for parts in peaks.values():
        assert parts["commitlog"] > 0 and parts["data_dir"] >= parts["commitlog"]
    assert isinstance(result["within_limit"], bool)
    assert set(result["bounds_held"]) == {"index", "consumequeue", "snapshots", "other"}
    assert all(r["segments_deleted"] > 0 for r in result["retention"].values())
    consumer = result["slow_consumer"]
    assert consumer["moved_forward"] >= 1 and consumer["skipped_messages"] > 0
    rejoin = result["rejoin"]
    assert rejoin["installs_received"] == 1 and rejoin["caught_up"]
    assert rejoin["install_bytes"] > 0 and rejoin["install_seconds"] > 0
    assert plot.stat().st_size > 0
    assert len(json.loads(samples.read_text())) == result["samples"] > 0
    assert list(data.iterdir()) == []  # it removed the nodes' data


def test_profile_calls_counts_each_servers_calls_per_message() -> None:
    out = run_bench("bench/profile_calls.py", "--window", "1", "--messages", "200",
                    "--warmup", "100", "--top", "5", timeout=300)
    result = json.loads(out)
    assert result["bench"] == "profile_calls" and result["messages"] == 200
    for role in ("leader", "follower_1", "follower_2"):
        figures = result[role]
        # Every message is at least an entry decoded and applied on each node.
        assert figures["calls_per_msg"] > figures["python_calls_per_msg"] > 10
        assert len(figures["top_by_time"]) == len(figures["top_by_calls"]) == 5
        assert all(row["calls_per_msg"] > 0 for row in figures["top_by_calls"])
    # The leader also runs the send handler and answers the client.
    assert result["leader"]["calls_per_msg"] > max(result["follower_1"]["calls_per_msg"],
                                                   result["follower_2"]["calls_per_msg"])
    # The client's SDK, profiled in the bench's own process: a send is at
    # least its request encoded and its answer decoded.
    client = result["client"]
    assert client["calls_per_msg"] > client["python_calls_per_msg"] > 5
    for role in ("leader", "follower_1", "follower_2", "client"):
        for row in result[role]["top_by_time"] + result[role]["top_by_calls"]:
            where, _, name = row["function"].partition(":")
            assert name and (where == "~" or where.endswith(".py")), row


def test_cycles_bench_finds_no_reference_cycle_per_operation() -> None:
    """Every process of the group, and the client, over each kind of
    operation: an answered request must leave nothing for the cyclic
    collector. What a connection, a producer or a consumer leaves once, when
    it closes, stays far below one object per operation at this count; a
    cycle made per request is ten or more (the Reply of 6cc81fa was ~10)."""
    ops = 600
    out = run_bench("bench/cycles.py", "--ops", str(ops), timeout=300)
    result = json.loads(out)
    phases = result["phases"]
    assert set(phases) == {"send_single", "send_merged", "pull", "pull_long_poll", "offsets",
                           "push"}
    processes = {"client", "namesrv", "leader", "follower_1", "follower_2"}
    for name, phase in phases.items():
        assert phase["ops"] == (ops // 10 if name == "pull_long_poll" else ops)
        assert processes <= set(phase), name
        for process in processes:
            figures = phase[process]
            kept = sum(figures["top_types"].values())
            assert kept <= figures["objects_per_op"] * phase["ops"] + 0.5, (name, process)
            assert figures["objects_per_op"] < 1.0, (name, process, figures)


def test_floor_bench_moves_messages_through_four_processes_and_reports_their_cpu() -> None:
    out = run_bench("bench/floor.py", "--seconds", "1", "--rounds", "1", timeout=120)
    result = json.loads(out)
    assert result["bench"] == "floor"
    assert sorted(result["rounds"]) == ["async", "sync"]
    for flush, rounds in result["rounds"].items():
        [r] = rounds
        assert r["msgs_per_s"] > 0, flush
        assert 0 < r["p50_ms"] <= r["p99_ms"]
        cpu = r["cpu_us_per_msg"]
        assert set(cpu) == {"client", "leader", "follower_1", "follower_2", "servers"}
        # /proc counts CPU in clock ticks (10 ms): a short round on a busy
        # host may show a follower at 0, never all three servers.
        assert cpu["servers"] > 0 and all(v >= 0 for v in cpu.values()), cpu
        assert cpu["servers"] == pytest.approx(
            cpu["leader"] + cpu["follower_1"] + cpu["follower_2"], abs=0.2)


def test_timeline_chains_each_send_through_the_four_processes() -> None:
    out = run_bench("bench/timeline.py", "--messages", "200", "--warmup", "100", timeout=300)
    result = json.loads(out)
    assert result["bench"] == "timeline" and result["messages"] == 200
    # Most sends are chained (a heartbeat or a reserve's batch in between
    # can hide one).
    assert result["sends_chained"] > 150
    stages = result["stages_us"]
    parts = [stages[k] for k in stages if k != "round_trip"]
    assert len(parts) == 9 and all(v > 0 for v in parts), stages
    # The stages tile each round trip; medians of the parts need not add up
    # exactly, but they cannot exceed it by much or fall far short.
    assert 0.5 * stages["round_trip"] < sum(parts) < 1.5 * stages["round_trip"]
    # Each pass starts at its read; the leader's ends at the answer, the
    # follower's at its acknowledgement, after the steps between.
    ack, append = result["leader_ack_pass"], result["follower_append_pass"]
    assert ack["frame_in"] == 0.0 and append["frame_in"] == 0.0
    assert ack["core.step"] < ack["broker.apply"] < ack["node.completions"] <= ack["answer_out"]
    assert append["core.step"] < append["node.write"] < append["peer_out"]
