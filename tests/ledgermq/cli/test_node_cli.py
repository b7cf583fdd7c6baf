"""`ledgermq node identity|repair` as a user runs them (subprocesses), on real
data directories, and the repair path end to end: a broker refuses a damaged
identity, `node repair --config` sets the directory aside, the broker starts
on the fresh one under a new directory id."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from dledger.runtime.identity import IDENTITY_FILE, open_identity, read_identity
from ledgermq.base.loop import run
from ledgermq.base.ports import free_port
from ledgermq.base.processes import spawn
from ledgermq.broker.config import Peer, render_config
from ledgermq.broker.launcher import FAST, node_status

pytestmark = [pytest.mark.timeout(180)]

# The CLI tests' runner, without importing conftest's cluster fixture.
from .conftest import ledgermq  # noqa: E402

_READY = re.compile(r"broker listening on (\S+):(\d+)")


def _config(tmp_path: Path, data_dir: Path, node_id: int = 1, group: str = "g") -> Path:
    peers = {node_id: Peer(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")}
    path = tmp_path / f"n{node_id}.toml"
    path.write_text(render_config({"group": group, "node_id": node_id,
                                   "data_dir": str(data_dir), "log_level": "WARNING"},
                                  peers, FAST))
    return path


def test_identity_shows_the_directory_and_checks_a_config(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    ident = open_identity(str(d), "DefaultCluster/g", 1).identity
    shown = ledgermq("node", "identity", "--data-dir", str(d))
    assert shown.returncode == 0, shown.stderr
    assert "DefaultCluster/g" in shown.stdout and str(ident.directory_id) in shown.stdout
    assert "format version  1 (this build reads 1)" in shown.stdout
    as_json = json.loads(ledgermq("node", "identity", "-d", str(d), "-o", "json").stdout)
    assert as_json == {"data_dir": str(d), **ident.to_json()}
    # With the node's config: it matches; with another node's it would be refused.
    ok = ledgermq("node", "identity", "--config", str(_config(tmp_path, d)), "-o", "json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["matches_config"] is True
    other = ledgermq("node", "identity", "--config", str(_config(tmp_path, d, node_id=2)))
    assert other.returncode == 1
    assert other.stderr.strip().endswith("the directory belongs to node 1: the broker would"
                                         " refuse it")
    foreign = ledgermq("node", "identity", "-c", str(_config(tmp_path, d, group="h")))
    assert foreign.returncode == 1 and "'DefaultCluster/g'" in foreign.stderr


def test_identity_of_a_directory_without_one_says_what_happens_next(tmp_path: Path) -> None:
    missing = ledgermq("node", "identity", "-d", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "hardstate").write_bytes(b"x" * 40)
    old = ledgermq("node", "identity", "-d", str(tmp_path / "old"))
    assert old.returncode == 1 and "the next start adopts it" in old.stderr
    d = tmp_path / "bad"
    open_identity(str(d), "c", 1)
    (d / IDENTITY_FILE).write_bytes(b"\0" * 20)
    bad = ledgermq("node", "identity", "-d", str(d))
    assert bad.returncode == 1 and "is damaged (CRC mismatch)" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_repair_moves_the_directory_aside_and_prints_the_next_steps(tmp_path: Path) -> None:
    d = tmp_path / "n2"
    old = open_identity(str(d), "DefaultCluster/g", 2).identity
    (d / "hardstate").write_bytes(b"h" * 40)
    dry = ledgermq("node", "repair", "-d", str(d), "--dry-run")
    assert dry.returncode == 0 and f"would set {d} aside as {d}.damaged-" in dry.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n2"]  # nothing changed
    done = ledgermq("node", "repair", "-d", str(d))
    assert done.returncode == 0, done.stderr
    aside = next(tmp_path.glob("n2.damaged-*"))
    assert f"Set aside: {d} -> {aside}" in done.stdout and "nothing was deleted" in done.stdout
    assert (aside / "hardstate").read_bytes() == b"h" * 40
    new = read_identity(str(d))
    assert new is not None and new.directory_id != old.directory_id and new.node_id == 2
    assert f"New identity: node 2 of cluster 'DefaultCluster/g', directory id" \
           f" {new.directory_id}" in done.stdout
    assert "Next steps:" in done.stdout and "ledgermq member rejoin --node 2" in done.stdout
    assert f"Inspect {aside}" in done.stdout
    again = json.loads(ledgermq("node", "repair", "-d", str(d), "-o", "json").stdout)
    assert again["previous"] == new.to_json() and again["aside"] != str(aside)
    assert len(again["next_steps"]) == 4


def test_repair_without_a_readable_identity_needs_the_node_named(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    d.mkdir()
    (d / IDENTITY_FILE).write_bytes(b"junk")
    refused = ledgermq("node", "repair", "-d", str(d))
    assert refused.returncode == 1 and "give the node's cluster id and node id" in refused.stderr
    assert (d / IDENTITY_FILE).read_bytes() == b"junk"
    done = ledgermq("node", "repair", "-d", str(d), "--cluster-id", "c/g", "--node-id", "1")
    assert done.returncode == 0, done.stderr
    assert "Old identity: unreadable" in done.stdout
    assert (next(tmp_path.glob("n1.damaged-*")) / IDENTITY_FILE).read_bytes() == b"junk"


def test_a_broker_refusing_a_damaged_identity_starts_after_repair(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    config = _config(tmp_path, d)
    old = open_identity(str(d), "DefaultCluster/g", 1).identity
    (d / IDENTITY_FILE).write_bytes((d / IDENTITY_FILE).read_bytes()[:-1])  # torn
    refused = ledgermq("broker", "--config", str(config))
    assert refused.returncode == 1 and "is damaged" in refused.stderr
    # The broker is stopped: repair with its config, then start it.
    repaired = ledgermq("node", "repair", "--config", str(config))
    assert repaired.returncode == 0, repaired.stderr
    child = spawn("broker", [sys.executable, "-m", "ledgermq.cli", "broker", "--config",
                             str(config)], _READY)
    try:
        m = child.wait_ready(60)
        status = run(node_status(f"{m.group(1)}:{m.group(2)}"))
        assert status is not None
        ident = status["identity"]
        assert ident["how"] == "existing" and ident["directory_id"] != old.directory_id
        assert ident == {**read_identity(str(d)).to_json(), "how": "existing"}  # type: ignore[union-attr]
        # While the broker runs, repair refuses: the directory is in use.
        busy = ledgermq("node", "repair", "--config", str(config))
        assert busy.returncode == 1 and "in use by another process" in busy.stderr
    finally:
        assert child.stop() == 0


@pytest.mark.parametrize("raft, fragment", [
    ({"heartbeat_interval_ticks": 10, "election_timeout_ticks": 10},
     "broker: [raft] heartbeat_interval_ticks must be in [1, election_timeout_ticks)"),
    ({"preferred_leader": 7}, "broker: [raft] preferred_leader 7 is not a node id in [peers]"),
    ({"tick_ms": 10**24}, "broker: [raft] tick_ms * election_timeout_ticks = "),
], ids=["heartbeat", "preferred-leader", "huge-tick"])
def test_a_raft_setting_the_runtime_would_refuse_is_one_line_at_start(
        tmp_path: Path, raft: dict[str, int], fragment: str) -> None:
    """These used to end in a traceback from the Raft runtime (or, for the
    huge tick, in a broker that never elected a leader); the brackets of
    "[raft]" and "[peers]" are printed, not taken for markup."""
    path = tmp_path / "n1.toml"
    peers = {1: Peer(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")}
    path.write_text(render_config({"group": "g", "node_id": 1, "data_dir": str(tmp_path / "d")},
                                  peers, {**FAST, **raft}))
    refused = ledgermq("broker", "--config", str(path))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(fragment), refused.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was created
