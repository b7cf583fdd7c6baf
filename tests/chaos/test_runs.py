"""Short chaos runs on real broker processes in a private network namespace.

Each run is a real cluster (NameServer + 3 brokers), a real workload and
real faults for 20 s, checked by the history checker. The sync runs must be
valid; the bite test shows the harness finding acknowledged messages lost
when the group acknowledges before replicating. Waits inside the harness are
deadlines on conditions; nothing here asserts on elapsed time.

Partition+kill and delay run here with authentication and TLS on (which
exercises every unsecured code path too, plus the secured ones); their
unsecured twins and the other fault combinations are in the chaos matrix
(`python -m chaos.matrix`, docs/chaos.md), which keeps CI within its budget.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from chaos.netns import netns_available
from chaos.runner import RunConfig, run
from chaos.schedule import Schedule
from tests.support import is_root, require

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]


def needs_netns() -> None:
    require(is_root() and netns_available() is None,
            "chaos runs need root, ip and iptables (network namespaces)")


def short_run(tmp_path, nemesis: str, **kw) -> dict:
    config = RunConfig(out=tmp_path / "run", nemesis=nemesis, time_limit=15, rate=40,
                       seed=kw.pop("seed", 7), schedule=Schedule("fixed", 6, 4),
                       log_level="WARNING", **kw)
    return run(config, log=lambda _m: None)


def assert_clean(results: dict) -> None:
    check = results["checker"]
    assert results["valid"], json.dumps({k: check[k] for k in ("counts", "examples")})[:3000]
    assert check["sends"]["acknowledged"] > 100
    for kind in ("lost", "unexpected", "order", "inconsistent_offsets", "phantom"):
        assert check["counts"][kind] == 0
    starts = [op for op in results["availability"]["per_fault"]]
    assert starts, "the nemesis never struck"


def test_pause_leader_and_loss_sync_sending_one_request_per_message(tmp_path) -> None:
    """The producers' merging off: each send is its own request (the SDK's
    per-message path, `SendCoalescer.send_alone`); the other runs merge."""
    needs_netns()
    results = short_run(tmp_path, "pause-leader,loss", coalesce=False)
    assert results["run"]["coalesce"] is False
    assert_clean(results)


def test_power_loss_of_a_majority_with_flush_sync(tmp_path) -> None:
    needs_netns()
    results = short_run(tmp_path, "power-loss:targets=majority+torn_tail=100")
    assert_clean(results)
    history = (tmp_path / "run" / "history.jsonl").read_text().splitlines()
    cuts = [json.loads(line) for line in history if '"power-loss"' in line
            and '"bytes_dropped"' in line]
    assert cuts and all(len(c["value"]["detail"]["nodes"]) == 2 for c in cuts)


def test_the_harness_bites_replicate_async_leader_isolation(tmp_path) -> None:
    """replicate=async: an isolated leader keeps acknowledging what it cannot replicate;
    after the heal the new leader's log wins and those acknowledged messages are gone.
    Through the CLI, so its exit status is checked too."""
    needs_netns()
    out = tmp_path / "bite"
    proc = subprocess.run(
        [sys.executable, "-m", "ledgermq.cli", "chaos", "run", "--nodes", "3", "--nemesis",
         "partition-leader", "--time-limit", "20", "--rate", "80", "--replicate", "async",
         "--flush", "async", "--on", "6", "--off", "4", "--seed", "3", "--out", str(out)],
        capture_output=True, text=True, timeout=380)
    results = json.loads((out / "results.json").read_text())
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert results["checker"]["counts"]["lost"] > 0
    assert "lost" in results["checker"]["bad_kinds"]


def assert_secured(results: dict, run_dir) -> None:
    """The run really had authentication and TLS on every port, and its
    workload ran as the ACL user with the run's grants only."""
    assert results["run"]["secure"] is True
    assert results["checker"]["counts"]["duplicated"] == 0
    security = results["phases"]["security"]
    assert security["auth"] and security["tls"]
    user = security["workload_user"]
    assert user["access_key"] == "chaos-workload" and not user["admin"]
    assert user["topics"] == {"chaos": "PUB|SUB"}
    assert user["groups"] == {"chaos-consumers": "SUB", "chaos-drain": "SUB"}
    assert "secret" not in user
    for node in (1, 2, 3):
        config = (run_dir / "config" / f"n{node}.toml").read_text()
        for key in ("cluster_secret_file", "admin_secret_file", "tls_cert_file", "tls_ca_file"):
            assert f"{key} = " in config
    for name in ("cluster.secret", "admin.secret", "workload.secret", "node.key"):
        assert (run_dir / "security" / name).stat().st_mode & 0o077 == 0


def test_secured_partition_halves_and_leader_kill(tmp_path) -> None:
    """The same faults with authentication and TLS on every port (Raft peers,
    registrations, clients) and the workload as an ACL user: nothing
    acknowledged lost, duplicated or reordered."""
    needs_netns()
    results = short_run(tmp_path, "partition-halves,kill-leader", secure=True)
    assert_clean(results)
    assert_secured(results, tmp_path / "run")
    run_dir = tmp_path / "run"
    for name in ("history.jsonl", "results.json", "latency.png", "rate.png", "index.html"):
        assert (run_dir / name).exists()
    assert sorted(p.name for p in (run_dir / "data" / "chaos").iterdir()) == ["n1", "n2", "n3"]
    assert (run_dir / "logs" / "n1.log").stat().st_size > 0


def test_secured_delay_and_clock_skew(tmp_path) -> None:
    """TLS between peers through the link proxy (one certificate names every
    node address), with the nodes' wall clocks skewed by minutes: the proofs
    are challenge-based and the throwaway CA's certificates span decades."""
    needs_netns()
    results = short_run(tmp_path, "delay:delay_ms=100+jitter_ms=30,clock-skew", secure=True)
    assert results["capabilities"]["delay"] is None and results["capabilities"]["clock"] is None
    assert_clean(results)
    assert_secured(results, tmp_path / "run")
