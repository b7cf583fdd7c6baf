"""The end-of-run convergence check: a replica left behind is a finding, not silence."""

from __future__ import annotations

import asyncio
from typing import Any

from chaos.convergence import check_converged

ADDRESSES = {1: "n1", 2: "n2", 3: "n3"}


def _status(role: str, commit: int, applied: int, failed: str | None = None) -> dict[str, Any]:
    return {"role": role, "leader_ready": role == "leader", "term": 3, "commit_index": commit,
            "applied_index": applied, "last_index": applied, "failed": failed}


def _run(table: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    async def status_of(address: str) -> dict[str, Any] | None:
        value = table[address]
        return value() if callable(value) else value

    return asyncio.run(check_converged(ADDRESSES, status_of, poll_s=0.01, **kwargs))


def test_all_caught_up_converges() -> None:
    result = _run({"n1": _status("leader", 40, 40), "n2": _status("follower", 40, 40),
                   "n3": _status("follower", 40, 40)}, timeout=1.0)
    assert result["converged"] and result["target_commit"] == 40 and result["behind"] == []


def test_a_stuck_follower_is_reported() -> None:
    result = _run({"n1": _status("leader", 40, 40), "n2": _status("follower", 40, 40),
                   "n3": _status("follower", 14, 14)}, timeout=0.2)
    assert not result["converged"] and result["behind"] == [3]
    assert result["nodes"][3]["applied_index"] == 14


def test_a_failed_or_silent_node_is_reported_unless_expected_down() -> None:
    table = {"n1": _status("leader", 40, 40), "n2": _status("follower", 40, 40, failed="EIO"),
             "n3": None}
    result = _run(table, timeout=0.2)
    assert not result["converged"] and result["behind"] == [2, 3]
    assert result["nodes"][3] == {"answered": False}
    table["n2"] = _status("follower", 40, 40)
    assert _run(table, timeout=0.2, expected_down=[3])["converged"]


def test_no_leader_never_converges() -> None:
    result = _run({n: _status("follower", 40, 40) for n in ("n1", "n2", "n3")}, timeout=0.2)
    assert not result["converged"] and result["target_commit"] is None


def test_a_follower_that_catches_up_while_waiting_converges() -> None:
    progress = iter([10, 20, 30, 40, 40, 40, 40, 40, 40, 40])

    def lagging() -> dict[str, Any]:
        return _status("follower", 40, next(progress, 40))

    result = _run({"n1": _status("leader", 40, 40), "n2": _status("follower", 40, 40),
                   "n3": lagging}, timeout=2.0)
    assert result["converged"]
