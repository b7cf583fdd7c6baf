"""The report of one run: results.json, plots with shaded faults, index.html.

Layout of a run directory:

    history.jsonl      every operation (docs/audit.md's format)
    results.json       checker verdict, counts, availability, latency, run parameters
    latency.png        send latency over time (ok/fail/info), fault periods shaded
    rate.png           acknowledged sends and consumed messages per second, faults shaded
    index.html         ties the above together, with the node logs and data dirs
    logs/              one log per node process (and the NameServer)
    data/<group>/<node>/  each node's data directory (what `ledgermq audit` reads)
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos.history import Op
from chaos.stats import FaultWindow, fault_windows, latencies, throughput

# One colour per nemesis name, stable across plots.
_PALETTE = ["#f4a261", "#90be6d", "#9b5de5", "#f15bb5", "#00bbf9", "#e9c46a", "#8d99ae"]
_TYPE_COLOURS = {"ok": "#2a9d8f", "fail": "#e63946", "info": "#457b9d"}


def _shade(ax: Any, windows: Sequence[FaultWindow], t_end: float) -> None:
    colours: dict[str, str] = {}
    for w in windows:
        colour = colours.setdefault(w.name, _PALETTE[len(colours) % len(_PALETTE)])
        ax.axvspan(w.start, w.end if w.end is not None else t_end, color=colour, alpha=0.18,
                   label=w.name if w.name not in ax.get_legend_handles_labels()[1] else None)


def plot_latency(ops: Sequence[Op], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = latencies(ops)
    t_end = max((p.t for p in points), default=1.0)
    fig, ax = plt.subplots(figsize=(10, 4))
    _shade(ax, fault_windows(ops), t_end)
    for kind in ("ok", "info", "fail"):
        xs = [p.t for p in points if p.type == kind]
        ys = [max(p.latency_ms, 0.01) for p in points if p.type == kind]
        if xs:
            ax.scatter(xs, ys, s=4, color=_TYPE_COLOURS[kind], label=f"send {kind}")
    ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("send latency")
    ax.legend(loc="upper right", fontsize="small", markerscale=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_rate(ops: Sequence[Op], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sends = throughput(ops, "send")
    polls = throughput(ops, "poll")
    t_end = max((t for s in (*sends.values(), *polls.values()) for t, _ in s), default=1.0)
    fig, ax = plt.subplots(figsize=(10, 4))
    _shade(ax, fault_windows(ops), t_end)
    for kind, series in sorted(sends.items()):
        ax.plot([t for t, _ in series], [r for _, r in series], color=_TYPE_COLOURS[kind],
                label=f"send {kind}/s")
    if "ok" in polls:
        ax.plot([t for t, _ in polls["ok"]], [r for _, r in polls["ok"]], color="#264653",
                linestyle="--", label="consumed/s")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("operations per second")
    ax.set_title("throughput")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_results(results: dict[str, Any], out: str | Path) -> Path:
    path = Path(out) / "results.json"
    path.write_text(json.dumps(results, indent=2, sort_keys=False, default=str) + "\n")
    return path


def write_index(results: dict[str, Any], out: str | Path) -> Path:
    """index.html: verdict, counts, availability, plots, links to logs and data."""
    out = Path(out)
    check = results.get("checker", {})
    # The run's verdict, not the checker's alone: a node that never came back
    # or a run that did not finish is not valid, whatever the history says.
    valid = bool(results.get("valid"))
    verdict = "VALID" if valid else "INVALID"
    colour = "#2a9d8f" if valid else "#e63946"
    because = "".join(f"<li>{html.escape(r)}</li>" for r in results.get("invalid_because", []))
    nodes = _nodes_section(results.get("nodes", {}))
    retention = _retention_section(results.get("retention"), check.get("retention", {}))
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>"
        for k, v in check.get("counts", {}).items())
    examples = html.escape(json.dumps(check.get("examples", {}), indent=1)[:20000])
    faults = "".join(
        f"<tr><td>{html.escape(str(f['nemesis']))}</td><td>{f['start']}</td>"
        f"<td>{f['end']}</td><td>{f['unavailable_s']}</td></tr>"
        for f in results.get("availability", {}).get("per_fault", []))
    links = []
    for sub in ("logs", "data"):
        base = out / sub
        if base.is_dir():
            for root, _dirs, files in sorted(os.walk(base)):
                if sub == "data" and Path(root).parent.parent != base:
                    continue
                rel = Path(root).relative_to(out)
                if sub == "logs":
                    links += [f'<li><a href="{html.escape(str(rel / f))}">'
                              f"{html.escape(str(rel / f))}</a></li>" for f in sorted(files)]
                else:
                    links.append(f'<li><a href="{html.escape(str(rel))}/">'
                                 f"{html.escape(str(rel))}</a></li>")
    params = html.escape(json.dumps(results.get("run", {}), indent=1))
    sends = html.escape(json.dumps(check.get("sends", {})))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>LedgerMQ chaos run</title>
<style>body{{font-family:sans-serif;margin:2em}}
td,th{{padding:2px 10px;border-bottom:1px solid #ddd}}
pre{{background:#f6f6f6;padding:8px;overflow:auto}}</style></head><body>
<h1>LedgerMQ chaos run: <span style="color:{colour}">{verdict}</span></h1>
{f"<ul>{because}</ul>" if because else ""}
<p>Sends: {sends}</p>
<h2>Run</h2><pre>{params}</pre>
<h2>Anomalies</h2><table><tr><th>kind</th><th>count</th></tr>{rows}</table>
<p>Violations: {html.escape(", ".join(check.get("bad_kinds", [])) or "none")}</p>
{nodes}
{retention}
<h2>Faults and unavailability</h2>
<table><tr><th>nemesis</th><th>start (s)</th><th>end (s)</th>
<th>longest gap without acks (s)</th></tr>
{faults}</table>
<h2>Latency</h2><img src="latency.png" alt="latency over time">
<h2>Throughput</h2><img src="rate.png" alt="throughput over time">
<h2>Examples</h2><pre>{examples}</pre>
<h2>Files</h2><ul><li><a href="history.jsonl">history.jsonl</a></li>
<li><a href="results.json">results.json</a></li>{"".join(links)}</ul>
</body></html>
"""
    path = out / "index.html"
    path.write_text(page)
    return path


def _nodes_section(nodes: dict[str, Any]) -> str:
    """Nodes that did not come back: each failed restart with its reason and log tail."""
    failures = nodes.get("restart_failures", [])
    down = nodes.get("down_at_end", [])
    if not nodes.get("final"):
        checked = "The nodes were not checked after the final heal (the run did not get there)."
    else:
        checked = "Every node was up after the final heal." if not down else ""
    if not failures and not down:
        return f"<h2>Nodes</h2><p>Every restart came back. {checked}</p>"
    parts = ["<h2>Nodes that did not come back</h2>",
             f"<p>Down after the final heal: {html.escape(str(down) if down else 'none')}; "
             f"allowed to stay down (<code>may_stay_down=1</code>): "
             f"{html.escape(str(nodes.get('allowed_down', [])))}</p>"]
    for f in failures:
        allowed = " (allowed: may_stay_down)" if f.get("allowed") else ""
        parts.append(f"<h3>node {f['node']} after {html.escape(str(f['nemesis']))}{allowed}</h3>"
                     f"<p>{html.escape(str(f['reason']))}; exit status "
                     f"{html.escape(str(f.get('exit_status')))}</p>"
                     f"<pre>{html.escape(chr(10).join(f.get('log_tail', [])))}</pre>")
    return "\n".join(parts)


def _retention_section(kept: dict[str, Any] | None, checked: dict[str, Any]) -> str:
    """Retention runs: the settings, what each node deleted and installed, and
    what the checker counted as expired (never as read)."""
    if not kept:
        return ""
    rows = "".join(
        f"<tr><td>n{html.escape(n)}</td><td>{v.get('first_index_first')}</td>"
        f"<td>{v.get('first_index_last')}</td><td>{v.get('first_index_moves', 0)}</td>"
        f"<td>{v['disk'].get('segments_gone')}</td><td>{v['disk'].get('segments')}</td>"
        f"<td>{v.get('snapshots_written', 0)}</td><td>{v.get('installs_received', 0)}</td>"
        f"<td>{v.get('installs_sent', 0)}</td></tr>"
        for n, v in kept["nodes"].items())
    settings = html.escape(json.dumps(kept["settings"]))
    return f"""<h2>Retention</h2><p>Settings: {settings}</p>
<table><tr><th>node</th><th>first index (first sample)</th><th>first index (last)</th>
<th>times it moved</th><th>segments gone</th><th>segments left</th>
<th>snapshots written</th><th>installs received</th><th>installs sent</th></tr>
{rows}</table>
<p>Expired (the drain was told they were deleted): {checked.get('expired', 0)}, of which
read live before: {checked.get('expired_read_live', 0)}; cannot tell expired from lost:
{checked.get('expired_unknown', 0)}; where the drain was moved to:
{html.escape(json.dumps(checked.get('drain_floor', {})))}</p>"""


def write_report(ops: Sequence[Op], results: dict[str, Any], out: str | Path) -> None:
    """results.json, the two plots and index.html into `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_results(results, out)
    plot_latency(ops, out / "latency.png")
    plot_rate(ops, out / "rate.png")
    write_index(results, out)
