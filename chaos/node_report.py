"""What became of the nodes in a run, and whether that lets the run be valid.

Inputs: every restart a nemesis attempted (`Context.restarts`: node,
nemesis, whether it came back, why not, exit status, log tail, and whether
the nemesis was told `may_stay_down=1`), and each node's state after the
final heal (`Backend.wait_node`). A node that did not come back is always
reported. It makes the run invalid unless the run said so explicitly: the
failed restart came from a nemesis with `may_stay_down=1`, and a node down
at the end is excused only when its last restart was such a failure. A node
down at the end that no nemesis failed to restart (it crashed by itself, or
was never restarted) is never excused.
"""

from __future__ import annotations

from typing import Any


def node_report(restarts: list[dict[str, Any]],
                final: dict[int, dict[str, Any]] | None) -> dict[str, Any]:
    """Findings about the nodes; `ok` is False when one of them makes the run invalid."""
    failures = [r for r in restarts if not r["ready"]]
    last_restart = {r["node"]: r for r in restarts}
    problems = [f"node {f['node']} did not come back after {f['nemesis']}: {f['reason']}"
                for f in failures if not f["allowed"]]
    down = sorted(n for n, state in (final or {}).items() if not state["ready"])
    allowed_down = []
    for node in down:
        last = last_restart.get(node)
        if last is not None and not last["ready"] and last["allowed"]:
            allowed_down.append(node)
        else:
            problems.append(f"node {node} is down after the final heal: "
                            f"{(final or {})[node]['reason']}")
    if final is None:
        problems.append("the nodes were not checked after the final heal (the run did not "
                        "get that far)")
    return {
        "ok": not problems,
        "problems": problems,
        "restart_failures": failures,
        "down_at_end": down,
        "allowed_down": allowed_down,
        "final": {str(n): state for n, state in sorted((final or {}).items())},
    }
