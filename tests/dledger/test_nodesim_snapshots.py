"""The real-node simulator with compaction: snapshots, log deletion below them
and snapshot installs, with every check of the simulator still holding."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dledger.testing.nodesim import NodeSimOptions, run_seed
from ledgermq.cli import app

COMPACTION = NodeSimOptions(nodes=3, compaction=True, segment_size=4096)
SEEDS = range(1, 41)


def test_compaction_seeds_have_no_violation_and_install() -> None:
    results = [run_seed(s, COMPACTION) for s in SEEDS]
    failed = [(r.seed, r.violation) for r in results if not r.ok]
    assert not failed, failed
    total = {key: sum(r.counts[key] for r in results)
             for key in ("snapshots", "compactions", "segments_deleted", "installs", "lags")}
    # Logs were cut, and nodes that fell behind them caught up by install.
    assert total["compactions"] > 0 and total["segments_deleted"] > 0, total
    assert total["installs"] > 0, total
    assert any("installed snapshot" in line for r in results for line in r.trace)


def test_five_nodes_with_compaction() -> None:
    options = NodeSimOptions(nodes=5, compaction=True, segment_size=4096)
    failed = [(s, r.violation) for s in range(1, 11) if not (r := run_seed(s, options)).ok]
    assert not failed, failed


def test_a_compaction_seed_replays_exactly() -> None:
    first = run_seed(5, COMPACTION)
    again = run_seed(5, COMPACTION)
    assert (first.trace, first.steps, first.counts, first.violation) == (
        again.trace, again.steps, again.counts, again.violation)
    assert first.counts["compactions"] > 0


def test_runs_without_compaction_do_not_compact() -> None:
    result = run_seed(5, NodeSimOptions(nodes=3, segment_size=4096))
    assert result.ok, result.violation
    assert result.counts["snapshots"] == result.counts["installs"] == result.counts["lags"] == 0


def test_the_cli_reports_compactions_and_installs() -> None:
    result = CliRunner().invoke(app, ["sim", "--real-node", "--compaction", "--seeds", "6",
                                      "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["violations"] == 0 and summary["compaction"] is True
    for key in ("snapshots", "compactions", "segments_deleted", "installs"):
        assert key in summary
    assert summary["compactions"] > 0
