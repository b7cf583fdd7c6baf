"""A node that cannot restart is reported as failed, never as restarted.

Real brokers in a real network namespace. The broker's data directory is
damaged where recovery must refuse it (bits flipped in `hardstate`, which
carries a CRC), so the restarted process dies with CorruptionError, and its
traceback shows the source line that prints "broker listening on": the
text the harness used to wait for.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from chaos import disk_faults
from chaos.backend import ClusterSpec
from chaos.nemesis import Context, Kill
from chaos.netns import NetnsBackend, netns_available
from chaos.node_report import node_report
from chaos.runner import RunConfig, run
from chaos.schedule import Schedule
from tests.support import is_root, require

pytestmark = pytest.mark.timeout(300)


def needs_netns() -> None:
    require(is_root() and netns_available() is None,
            "restart tests need root, ip and iptables (network namespaces)")


def wait_for(path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_a_broker_that_dies_at_restart_is_reported_failed(tmp_path) -> None:
    needs_netns()
    backend = NetnsBackend(ClusterSpec(nodes=1, log_level="WARNING"), tmp_path,
                           log=lambda _m: None)
    backend.start()
    try:
        ctx = Context(backend, random.Random(1), leader=lambda: None, log=lambda _m: None,
                      restart_timeout=30.0)
        hardstate = backend.data_dir(1) / "hardstate"
        wait_for(hardstate)  # the node has voted for itself: hardstate exists
        kill = Kill()
        assert kill.start(ctx) == {"killed": [1]}
        assert kill.stop(ctx) == {"restarted": [1], "failed": []}  # a clean restart is fine

        kill.start(ctx)
        disk_faults.flip_bits(hardstate, 8, random.Random(2))
        detail = kill.stop(ctx)
        assert detail["restarted"] == [] and detail["failed"] == [1], detail
        failure = detail["failures"][0]
        assert failure["exit_status"] not in (None, 0)
        assert "exited with status" in failure["reason"]
        # The broker says why in one line (rich may wrap it): the damaged file.
        assert "hardstate at offset" in "".join(failure["log_tail"]) and \
            "CRC mismatch" in failure["log_tail"][-1], failure["log_tail"]
        assert not backend.node_alive(1)
        assert [(r["node"], r["ready"], r["allowed"]) for r in ctx.restarts] == \
            [(1, True, False), (1, False, False)]
        # The trap the old check fell into: the dead node's log has the ready text.
        assert "broker listening on" in (tmp_path / "logs" / "n1.log").read_text()

        # Said explicitly, the same failure is still reported, but allowed.
        lenient = Kill(may_stay_down="1")
        lenient.start(ctx)
        assert lenient.stop(ctx)["failures"][0]["allowed"] is True
        final = {1: backend.wait_node(1, 5.0).as_dict()}
        report = node_report(ctx.restarts, final)
        assert report["down_at_end"] == [1] and report["allowed_down"] == [1]
        assert not report["ok"]  # the first, undeclared failure still counts
    finally:
        backend.close()


def test_a_run_with_a_node_that_never_came_back_is_not_valid(tmp_path) -> None:
    """bitflip on hardstate: the victim refuses to restart every time. The run must
    say so (results.json, index.html) and must not be valid."""
    needs_netns()
    out = tmp_path / "run"
    config = RunConfig(out=out, nemesis="bitflip:file=hardstate", time_limit=6, rate=20,
                       seed=5, schedule=Schedule("fixed", 3, 1), producers=1, consumers=1,
                       log_level="WARNING", final_node_timeout=5.0)
    results = run(config, log=lambda _m: None)
    nodes = results["nodes"]
    victim = nodes["restart_failures"][0]["node"]
    assert results["valid"] is False
    assert results["checker"]["valid"], "the history itself is clean: the node is the finding"
    assert nodes["down_at_end"] == [victim] and nodes["allowed_down"] == []
    assert any(f"node {victim} did not come back after bitflip" in r
               for r in results["invalid_because"])
    assert json.loads((out / "results.json").read_text())["valid"] is False
    page = (out / "index.html").read_text()
    assert "INVALID" in page and "Nodes that did not come back" in page
    stops = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()
             if '"nemesis"' in line and '"restarted"' in line]
    assert stops and all(s["value"]["detail"]["failed"] == [victim] for s in stops)
