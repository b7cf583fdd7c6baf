"""Which node outcomes leave a run valid: only what the run declared acceptable."""

from __future__ import annotations

from typing import Any

from chaos.node_report import node_report
from chaos.runner import verdict_reasons


def attempt(node: int, ready: bool, allowed: bool = False, nemesis: str = "bitflip") -> dict:
    return {"node": node, "ready": ready, "allowed": allowed, "nemesis": nemesis,
            "reason": "alive and answering PING" if ready else "exited with status 1",
            "exit_status": None if ready else 1, "log_tail": [] if ready else ["CorruptionError"]}


def up(*nodes: int, down: tuple[int, ...] = ()) -> dict[int, dict[str, Any]]:
    return {n: {"ready": n not in down, "reason": "exited with status 1" if n in down
                else "alive and answering PING"} for n in (*nodes, *down)}


def test_every_node_back_is_ok() -> None:
    report = node_report([attempt(2, True)], up(1, 2, 3))
    assert report["ok"] and report["problems"] == [] and report["down_at_end"] == []


def test_a_failed_restart_is_a_problem_even_if_the_node_came_back_later() -> None:
    report = node_report([attempt(1, False), attempt(1, True)], up(1, 2, 3))
    assert not report["ok"]
    assert report["problems"] == ["node 1 did not come back after bitflip: exited with status 1"]
    assert [f["node"] for f in report["restart_failures"]] == [1]


def test_a_node_down_at_the_end_without_may_stay_down_is_a_problem() -> None:
    report = node_report([attempt(1, False)], up(2, 3, down=(1,)))
    assert not report["ok"] and report["down_at_end"] == [1] and report["allowed_down"] == []
    assert len(report["problems"]) == 2


def test_may_stay_down_excuses_exactly_the_node_it_failed_to_restart() -> None:
    report = node_report([attempt(1, False, allowed=True)], up(2, 3, down=(1,)))
    assert report["ok"] and report["allowed_down"] == [1] and report["down_at_end"] == [1]
    assert report["restart_failures"][0]["log_tail"] == ["CorruptionError"]  # still reported
    # Another node down that no allowed restart explains is not excused.
    report = node_report([attempt(1, False, allowed=True)], up(3, down=(1, 2)))
    assert not report["ok"] and report["allowed_down"] == [1]
    assert report["problems"] == ["node 2 is down after the final heal: exited with status 1"]


def test_an_allowed_failure_does_not_excuse_a_later_crash() -> None:
    # Failed (allowed), came back on the next restart, then died by itself.
    report = node_report([attempt(1, False, allowed=True), attempt(1, True)],
                         up(2, 3, down=(1,)))
    assert not report["ok"] and report["allowed_down"] == []


def test_unchecked_nodes_are_not_taken_for_healthy_ones() -> None:
    report = node_report([], None)
    assert not report["ok"] and "not checked" in report["problems"][0]


def test_the_verdict_lists_every_reason() -> None:
    results = {"checker": {"valid": False, "bad_kinds": ["lost"]},
               "phases": {"error": "HarnessError('torn trace')"},
               "nodes": node_report([attempt(1, False)], up(1, 2, 3))}
    assert verdict_reasons(results) == [
        "checker: lost", "the run did not finish: HarnessError('torn trace')",
        "node 1 did not come back after bitflip: exited with status 1"]
    clean = {"checker": {"valid": True}, "phases": {}, "nodes": node_report([], up(1, 2, 3))}
    assert verdict_reasons(clean) == []


def test_a_replica_that_did_not_catch_up_makes_the_run_invalid() -> None:
    stuck = {"converged": False, "behind": [3], "target_commit": 812}
    results = {"checker": {"valid": True}, "phases": {"convergence": stuck},
               "nodes": node_report([], up(1, 2, 3))}
    assert verdict_reasons(results) == [
        "nodes [3] did not catch up with the leader's commit index 812 after the drain"]
    results["phases"]["convergence"] = {"converged": True, "behind": [], "target_commit": 812}
    assert verdict_reasons(results) == []


def test_a_run_refuses_an_output_directory_that_holds_an_earlier_run(tmp_path) -> None:
    """Reusing --out used to start the earlier run's (maybe damaged) data
    directories as this run's nodes and append to its history."""
    import pytest

    from chaos.runner import RunConfig, run

    (tmp_path / "history.jsonl").write_text("")
    with pytest.raises(ValueError, match="already holds a chaos run"):
        run(RunConfig(out=tmp_path), log=lambda line: None)
