"""Membership changes under load, on real broker processes in a network namespace.

Each run is a real group (NameServer, 3 brokers, spares started when they
join), a real workload, and membership changes made through the nodes'
admin apps while the producers send: replace every node one by one, wipe a
follower's disk and repair it, and random churn mixed with kills and
partitions. (CI budget: three runs. Grow 3 -> 5, shrink 5 -> 3, remove the
leader and a damaged node repaired through `ledgermq node repair` are the
other cells of `ledgermq chaos matrix --membership`, whose results are in
docs/chaos.md; tests/ops/test_members.py makes the same changes through the
CLI on a real deployment.) Every run must lose nothing
acknowledged, duplicate nothing, carry out every step of its plan and end in
the configuration intended; the plan runs end as soon as their plan is done
(`--time-limit` is only their cap).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos.netns import netns_available
from chaos.runner import RunConfig, run
from chaos.schedule import Schedule
from tests.support import is_root, require

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def needs_netns() -> None:
    require(is_root() and netns_available() is None,
            "chaos runs need root, ip and iptables (network namespaces)")


def membership_run(tmp_path: Path, nemesis: str, *, nodes: int = 3, time_limit: float = 45,
                   schedule: Schedule | None = None, seed: int = 11) -> dict[str, Any]:
    config = RunConfig(out=tmp_path / "run", nodes=nodes, nemesis=nemesis,
                       time_limit=time_limit, rate=40, seed=seed,
                       schedule=schedule or Schedule("fixed", 1, 3), producers=2, consumers=1,
                       log_level="WARNING")
    return run(config, log=lambda _m: None)


def assert_clean(results: dict[str, Any]) -> dict[str, Any]:
    """Valid, nothing lost or duplicated; returns the membership section."""
    check = results["checker"]
    changes = results["membership"]
    assert results["valid"], json.dumps({"because": results["invalid_because"],
                                         "counts": check["counts"],
                                         "steps": changes["steps"]})[:4000]
    assert check["sends"]["acknowledged"] > 100
    for kind in ("lost", "duplicated", "order", "inconsistent_offsets", "skipped_offsets"):
        assert check["counts"][kind] == 0, kind
    assert changes["problems"] == []
    assert changes["final"]["learners"] == [] and not changes["final"]["pending"]
    for step in changes["steps"]:
        assert step["ok"] and step["gap_s"] is not None, step
    return changes


def data_nodes(tmp_path: Path, where: str = "data") -> list[str]:
    base = tmp_path / "run" / where / "chaos"
    return sorted(p.name.split("-")[0] for p in base.iterdir()) if base.is_dir() else []


def test_replace_every_node_of_a_three_node_group(tmp_path: Path) -> None:
    needs_netns()
    changes = assert_clean(membership_run(tmp_path, "replace-each"))
    assert [(s["step"], s["nodes"]["old"], s["nodes"]["new"]) for s in changes["steps"]] == [
        ("replace", 1, 4), ("replace", 2, 5), ("replace", 3, 6)]
    assert changes["final"]["voters"] == [4, 5, 6]
    assert sorted(changes["removed"]) == [1, 2, 3]
    assert changes["route_nodes"] == [4, 5, 6]  # the drain read from the final members
    # Each replace committed add_learner, promote and remove entries; the
    # leader's replace is answered LEADERSHIP_MOVED after its first two (they
    # are not in that answer) and the retry on the new leader resumes it: only
    # the removal is left to commit there.
    for step in changes["steps"]:
        actions = [e["action"] for e in step["entries"]]
        assert actions[-1] == "remove"
        if not step["checks"].get("completed_with_single_operations"):
            assert actions in (["add_learner", "promote", "remove"], ["remove"]), actions
    # The replaced nodes' data is kept, out of data/ (not compared by the audit).
    assert data_nodes(tmp_path) == ["n4", "n5", "n6"]
    assert data_nodes(tmp_path, "removed") == ["n1", "n2", "n3"]





def test_a_wiped_node_cannot_vote_until_it_rejoins(tmp_path: Path) -> None:
    needs_netns()
    changes = assert_clean(membership_run(tmp_path, "wipe-repair:mode=wipe",
                                          schedule=Schedule("fixed", 4, 3)))
    [step] = changes["steps"]
    checks = step["checks"]
    node = step["nodes"]["node"]
    assert checks["identity_mismatch_seen"] is True
    assert checks["leader_while_wiped"] != node
    assert checks["heard_directory_id"] not in (0, step["nodes"]["pinned_directory_id"])
    # The new directory id the leader heard is the one the node's IDENTITY file names.
    assert checks["identity_directory_id"] == checks["heard_directory_id"]
    assert checks["rejoin_directory_id"] == 0  # `member rejoin --node N`: as heard
    assert checks["rejoined_directory_id"] == checks["heard_directory_id"]
    assert checks["role_after"] == "voter"
    assert changes["final"]["voters"] == [1, 2, 3]
    assert changes["final"]["directories"][str(node)] == checks["heard_directory_id"]
    assert [e["action"] for e in step["entries"]][-2:] == ["rejoin", "promote"]
    assert data_nodes(tmp_path, "wiped") == [f"n{node}"]  # kept, not deleted



def test_random_churn_with_kills_and_partitions(tmp_path: Path) -> None:
    needs_netns()
    results = membership_run(tmp_path, "membership,kill,partition-halves", time_limit=22,
                             schedule=Schedule("random", 6, 3), seed=4)
    check = results["checker"]
    assert results["valid"], json.dumps({"because": results["invalid_because"],
                                         "steps": results["membership"]["steps"]})[:4000]
    assert check["counts"]["lost"] == 0 and check["counts"]["duplicated"] == 0
    changes = results["membership"]
    assert changes["steps"], "the churn never changed anything"
    assert changes["final"]["learners"] == []
    assert sorted(changes["believed_members"]) == changes["final"]["voters"]
