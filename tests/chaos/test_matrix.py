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
