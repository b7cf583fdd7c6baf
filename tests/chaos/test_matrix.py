"""The evidence matrix's cells and verdicts (the runs themselves are long)."""

from __future__ import annotations

from chaos.matrix import cell_passed, cells


def test_every_sync_cell_must_be_valid_and_the_bite_cells_must_lose() -> None:
    by_name = {c["name"]: c for c in cells([3, 5])}
    sync = [c for c in by_name.values() if c["name"].startswith("sync-")]
    assert sync and all(c["expect"] == "valid" and c["flush"] == "sync"
                        and c["replicate"] == "sync" for c in sync)
    assert {c["nodes"] for c in sync} == {3, 5}
    assert by_name["async-partition-leader"]["expect"] == "lost"
    assert by_name["flush-async-power-loss"]["expect"] == "lost"
    assert by_name["flush-sync-power-loss"]["expect"] == "valid"
    assert by_name["flush-async-power-loss-5n"]["expect"] == "lost"
    assert by_name["flush-sync-power-loss-5n"]["nodes"] == 5
    # A SIGKILL alone rarely finds an ack the followers lack: reported only.
    assert by_name["async-kill-leader"]["expect"] == "report"
    # Only the file faults say, explicitly, that their victim may stay down.
    lenient = {c["name"] for c in by_name.values() if "may_stay_down=1" in c["nemesis"]}
    assert lenient == {f"sync-{f}-{n}n" for f in ("truncate", "bitflip") for n in (3, 5)}


def test_verdicts() -> None:
    def results(valid: bool, lost: int, nodes_ok: bool = True, converged: bool = True) -> dict:
        return {"valid": valid, "checker": {"counts": {"lost": lost}},
                "nodes": {"ok": nodes_ok}, "phases": {"convergence": {"converged": converged}}}

    assert cell_passed("valid", results(True, 0))
    assert not cell_passed("valid", results(False, 3))
    assert cell_passed("lost", results(False, 3))
    assert not cell_passed("lost", results(True, 0))
    # A bite with a node that never came back does not count as the bite.
    assert not cell_passed("lost", results(False, 3, nodes_ok=False))
    # ... nor one with a replica that never caught up (a stuck follower).
    assert not cell_passed("lost", results(False, 3, converged=False))
    assert cell_passed("report", results(True, 0)) and cell_passed("report", results(False, 2))


def test_the_cli_runs_the_matrix_and_refuses_an_unknown_security_mode(tmp_path) -> None:
    import json
    import subprocess
    import sys

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ledgermq.cli", "chaos", "matrix", *args],
                              capture_output=True, text=True, timeout=120)

    bad = cli("--security", "tls-only", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "unknown security mode" in bad.stderr
    # A filter that matches no cell: nothing runs, the (empty) summary is written.
    none = cli("--secure", "--only", "no-such-cell", "--out", str(tmp_path / "none"))
    assert none.returncode == 0, none.stderr[-2000:]
    assert json.loads((tmp_path / "none" / "matrix.json").read_text()) == []


def test_the_retention_cells_are_the_sync_cells_and_a_bite() -> None:
    from chaos.matrix import retention_cells

    by_name = {c["name"]: c for c in retention_cells([3])}
    sync = {n for n in by_name if n != "retention-async-partition-leader"}
    assert {n.removeprefix("retention-") for n in sync} == {
        c["name"] for c in cells([3]) if c["name"].startswith("sync-")} | {
        "flush-sync-power-loss"}
    assert all(by_name[n]["expect"] == "valid" and by_name[n]["flush"] == "sync"
               and by_name[n]["replicate"] == "sync" for n in sync)
    for wanted in ("kill-leader", "partition-leader", "pause", "power-loss_targets=one+pause",
                   "kill-leader+partition-halves"):
        assert f"retention-sync-{wanted}-3n" in by_name
    assert by_name["retention-async-partition-leader"]["expect"] == "lost"
    assert all(c["retention"] and not c["secure"] for c in by_name.values())


def test_a_retention_cell_must_show_deletions() -> None:
    def results(lost: int, deleted_on: list[int]) -> dict:
        return {"valid": False, "checker": {"counts": {"lost": lost}}, "nodes": {"ok": True},
                "phases": {"convergence": {"converged": True}},
                "retention": {"nodes_with_deletions": deleted_on}}

    assert cell_passed("lost", results(5, [1, 2, 3]))
    # A bite in a run where retention deleted nothing says nothing about retention.
    assert not cell_passed("lost", results(5, []))
