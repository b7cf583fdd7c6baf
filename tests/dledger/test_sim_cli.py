"""`ledgermq sim`: summary, JSON output, exit status on violations, single-seed replay."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ledgermq.cli import app

runner = CliRunner()


def test_sim_json_summary_passes() -> None:
    result = runner.invoke(app, ["sim", "--seeds", "3", "--nodes", "3", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["runs"] == 3 and summary["violations"] == 0 and summary["steps"] > 0


def test_sim_exits_nonzero_on_violation_and_prints_seed() -> None:
    result = runner.invoke(app, ["sim", "--seeds", "2", "--bug", "ack_before_persist"])
    assert result.exit_code == 1
    assert "seed=1" in result.output and "--seed 1" in result.output


def test_sim_replays_one_seed_with_trace() -> None:
    result = runner.invoke(app, ["sim", "--seed", "7", "--trace"])
    assert result.exit_code == 0, result.output
    assert "seed=7" in result.output and "leader" in result.output


def test_sim_rejects_bad_node_count() -> None:
    result = runner.invoke(app, ["sim", "--seeds", "1", "--nodes", "4"])
    assert result.exit_code != 0


def test_sim_async_flush_and_profile_options() -> None:
    result = runner.invoke(
        app, ["sim", "--seeds", "3", "--flush", "async", "--profile", "slow_disk", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["async_runs"] == 3 and summary["sync_runs"] == 0
    assert summary["profiles"] == {"slow_disk": 3}


def test_sim_rejects_unknown_flush_and_profile() -> None:
    assert runner.invoke(app, ["sim", "--seeds", "1", "--flush", "maybe"]).exit_code != 0
    assert runner.invoke(app, ["sim", "--seeds", "1", "--profile", "nope"]).exit_code != 0


def test_a_failure_under_another_connection_loss_share_replays_with_its_hint() -> None:
    """The printed replay command carries --connection-loss when the share is not
    the default, and running that command finds the same failure again."""
    result = runner.invoke(app, ["sim", "--seeds", "30", "--bug", "commit_old_term_by_counting",
                                 "--connection-loss", "0.2"], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    hint = next(line for line in result.output.splitlines() if "replay with:" in line)
    args = hint.split("ledgermq ", 1)[1].split()
    assert args[args.index("--connection-loss") + 1] == "0.2"
    again = runner.invoke(app, [*args, "--bug", "commit_old_term_by_counting"])
    assert again.exit_code == 1
    assert runner.invoke(app, ["sim", "--seeds", "1", "--connection-loss", "2"]).exit_code != 0
