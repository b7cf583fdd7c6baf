"""The membership nemeses' plans, and spare nodes in the backend, without a cluster."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from chaos import catalog, membership
from chaos.backend import ClusterSpec
from chaos.matrix import MEMBERSHIP, membership_cells
from chaos.members_api import anchored_steps, configuration, member_row
from chaos.nemesis import needs
from chaos.netns import NetnsBackend


def test_parse_knows_faults_and_membership_nemeses() -> None:
    nemeses = catalog.parse("replace-each,kill,wipe-repair:mode=corrupt+count=2")
    assert [n.name for n in nemeses] == ["replace-each", "kill", "wipe-repair"]
    assert nemeses[2].params == {"mode": "corrupt", "count": "2"}
    assert needs(nemeses) == {"membership", "kill", "file"}
    assert all(cls.doc and cls.needs for cls in catalog.REGISTRY.values())
    with pytest.raises(ValueError, match="mode must be wipe or corrupt"):
        catalog.parse("wipe-repair:mode=shred")
    with pytest.raises(ValueError, match="unknown nemesis"):
        catalog.parse("teleport")


def test_each_plan_says_how_many_spares_it_needs_and_what_it_intends() -> None:
    def plan(spec: str, nodes: int) -> tuple[int, dict | None]:
        nemeses = catalog.parse(spec)
        original = list(range(1, nodes + 1))
        spares = membership.spares_for(nemeses, nodes)
        return spares, membership.intention(
            nemeses, original, list(range(nodes + 1, nodes + spares + 1)))

    assert plan("replace-each", 3) == (3, {"voters": [4, 5, 6], "count": 3})
    assert plan("grow", 3) == (2, {"voters": [1, 2, 3, 4, 5], "count": 5})
    assert plan("grow:target=4", 3) == (1, {"voters": [1, 2, 3, 4], "count": 4})
    assert plan("shrink", 5) == (0, {"voters": None, "count": 3})
    # 3 voters, min 3: a spare joins before each leader leaves; the count stays.
    assert plan("remove-leader:count=2", 3) == (2, {"voters": None, "count": 3})
    assert plan("remove-leader:count=2", 5) == (0, {"voters": None, "count": 3})
    assert plan("wipe-repair", 3) == (0, {"voters": [1, 2, 3], "count": 3})
    # Churn, or two plans at once: only the configuration's consistency is checked.
    assert plan("membership,kill", 3)[1] is None
    assert plan("grow,wipe-repair", 3)[1] is None
    assert plan("kill", 3) == (0, None)


def test_plans_are_finished_only_when_carried_out() -> None:
    grow, wipe, churn = catalog.parse("grow,wipe-repair,membership")
    assert not grow.finished and not wipe.finished and not churn.finished
    kill = catalog.parse("kill")[0]
    assert not kill.finished  # a fault never finishes


def test_spares_are_peers_everywhere_but_not_bootstrap_members(tmp_path: Path) -> None:
    spec = ClusterSpec(nodes=3, spares=2, admin=True)
    assert spec.original_ids == [1, 2, 3] and spec.all_ids == [1, 2, 3, 4, 5]
    backend = NetnsBackend(spec, tmp_path, log=lambda _m: None)
    (tmp_path / "config").mkdir()
    for node in backend.all_node_ids:
        backend._write_config(node)
    for node in (1, 5):
        config = tomllib.loads((tmp_path / "config" / f"n{node}.toml").read_text())
        assert config["initial_members"] == [1, 2, 3]
        assert sorted(int(p) for p in config["peers"]) == [1, 2, 3, 4, 5]
        assert config["peers"]["5"]["raft"] == "127.0.0.15:7000"
        assert config["admin_listen"] == f"127.0.0.{10 + node}:8080"
    assert backend.raft_address(4) == "127.0.0.14:7000"
    # A node removed earlier comes back as a new machine: not a bootstrap member.
    backend.provision(2)
    config = tomllib.loads((tmp_path / "config" / "n2.toml").read_text())
    assert config["initial_members"] == [1, 3]


def test_without_spares_the_configuration_is_as_before(tmp_path: Path) -> None:
    backend = NetnsBackend(ClusterSpec(nodes=3), tmp_path, log=lambda _m: None)
    (tmp_path / "config").mkdir()
    backend._write_config(1)
    config = tomllib.loads((tmp_path / "config" / "n1.toml").read_text())
    assert "initial_members" not in config and "admin_listen" not in config
    assert sorted(config["peers"]) == ["1", "2", "3"]


def test_the_backend_follows_the_group_s_membership(tmp_path: Path) -> None:
    backend = NetnsBackend(ClusterSpec(nodes=3, spares=3), tmp_path, log=lambda _m: None)
    assert backend.node_ids == [1, 2, 3] and backend.removed == []
    backend.set_members([1, 2, 3, 4])
    backend.mark_removed(1)
    assert backend.node_ids == [2, 3, 4] and backend.removed == [1]
    backend.set_members([1, 2, 3, 4])  # n1 re-added as a new machine
    assert backend.removed == []
    with pytest.raises(ValueError, match="not nodes of this run"):
        backend.set_members([1, 9])


def test_data_set_aside_is_moved_never_deleted(tmp_path: Path) -> None:
    backend = NetnsBackend(ClusterSpec(nodes=3, spares=1), tmp_path, log=lambda _m: None)
    data = backend.data_dir(2)
    (data / "commitlog").mkdir(parents=True)
    (data / "commitlog" / "0").write_bytes(b"x" * 10)
    where = backend.set_aside_data(2, "wiped")
    assert where is not None and not data.exists()
    assert (where / "commitlog" / "0").read_bytes() == b"x" * 10
    assert where.is_relative_to(tmp_path / "wiped")
    assert backend.set_aside_data(2, "wiped") is None  # nothing left to move


def test_admin_answers_are_reduced_to_what_the_report_keeps() -> None:
    view = {"voters": [2, 1], "learners": [4], "membership_index": 9,
            "membership_pending": False, "leader_id": 1, "node_id": 1,
            "members": [{"node_id": 1, "directory_id": 11}, {"node_id": 2, "directory_id": 22},
                        {"node_id": 4, "directory_id": 44, "identity_mismatch": False}]}
    assert configuration(view) == {"voters": [1, 2], "learners": [4], "index": 9,
                                   "pending": False, "leader": 1,
                                   "directories": {"1": 11, "2": 22, "4": 44}}
    assert member_row(view, 4) == {"node_id": 4, "directory_id": 44, "identity_mismatch": False}
    assert member_row(view, 3) is None
    steps = anchored_steps([{"action": "add_learner", "node_id": 4, "index": 7, "seconds": 0.5},
                            {"action": "promote", "node_id": 4, "index": 8, "seconds": 1.0}],
                           10_000_000_000)
    assert [(s["started_ns"], s["finished_ns"]) for s in steps] == [
        (10_000_000_000, 10_500_000_000), (10_500_000_000, 11_500_000_000)]


def test_the_matrix_membership_cells_must_all_be_valid() -> None:
    cells = membership_cells()
    assert [c["name"] for c in cells] == [name for name, *_ in MEMBERSHIP]
    assert all(c["expect"] == "valid" and c["flush"] == "sync" and c["replicate"] == "sync"
               for c in cells)
    for cell in cells:
        catalog.parse(cell["nemesis"])  # every cell names real nemeses
    assert {c["nemesis"].split(":")[0].split(",")[0] for c in cells} == {
        "replace-each", "grow", "shrink", "remove-leader", "wipe-repair", "membership"}
