"""Audit outputs: summary.json, Parquet findings, and an HTML report with plots."""

from __future__ import annotations

import base64
import html
import json
import math
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from spark_audit import snapshots
from spark_audit.audit import AuditResult
from spark_audit.checks import CHECKS, INFO, VIOLATION

EXAMPLES_IN_SUMMARY = 5


def named_findings(res: AuditResult) -> pa.Table:
    """Findings with group, replica and file names next to their ids."""
    groups = {st.gid: st.name for st in res.groups.values()}
    reps = {(r.gid, r.rid): r.name for r in res.replicas}
    files = {f.fid: f.path for f in res.files}
    gid = res.findings.column("gid").to_pylist()
    rid = res.findings.column("rid").to_pylist()
    fid = res.findings.column("fid").to_pylist()
    t = res.findings
    t = t.append_column("group", pa.array([groups.get(g, "") for g in gid], pa.string()))
    t = t.append_column("replica", pa.array([reps.get((g, r), "") for g, r in zip(
        gid, rid, strict=True)], pa.string()))
    return t.append_column("file", pa.array([files.get(f, "") for f in fid], pa.string()))


def replica_rows(res: AuditResult) -> list[dict[str, Any]]:
    rows = []
    for st in res.groups.values():
        top = max((m.last_index for m in st.replicas.values()), default=0)
        for r in res.replicas:
            if r.gid != st.gid:
                continue
            m = st.replicas[r.rid]
            snap = snapshots.newest_usable(m)
            rows.append({
                "group": st.name, "replica": r.name, "root": r.root, "entries": m.entries,
                # The retained range: what retention (or an install) left on disk.
                "first_index": m.first_index, "last_index": m.last_index,
                "first_position": m.first_position, "last_position": m.last_position,
                "end_position": m.end_position, "segments": len(m.segment_starts),
                "prefix_removed": m.trimmed,
                "snapshots": len(m.snapshots),
                "snapshot_index": snap.index if snap else None,
                "snapshot_end_position": snap.end_position if snap else None,
                "last_term": m.last_term, "agree_start": m.agree_start, "agree_end": m.agree_end,
                "first_divergent": m.first_divergent, "lag": top - m.last_index,
                "commit_lag": max(0, st.committed - m.agree_end),
                "hardstate_commit": m.hardstate.commit if m.hardstate else None,
                "hardstate_term": m.hardstate.term if m.hardstate else None,
                "durable_index": m.checkpoint.durable_index if m.checkpoint else None,
                "dispatched_index": m.dispatch.dispatched_index if m.dispatch else None,
            })
    return rows


def summarize(res: AuditResult, duration_s: float, engine: str, master: str) -> dict[str, Any]:
    """The summary.json document: nested valid flags, counts, first examples."""
    f = named_findings(res).to_pylist()
    checks = {}
    for name in CHECKS:
        mine = [r for r in f if r["check"] == name]
        kinds: dict[str, dict[str, Any]] = {}
        for r in mine:
            k = kinds.setdefault(r["kind"], {"severity": r["severity"], "count": 0,
                                             "examples": []})
            k["count"] += r["count"]
            if len(k["examples"]) < EXAMPLES_IN_SUMMARY and r["detail"] != (
                    "further occurrences not listed"):
                k["examples"].append({x: r[x] for x in (
                    "group", "replica", "file", "file_offset", "index", "topic", "queue_id",
                    "slot", "phys_offset", "detail") if r[x] not in ("", -1, None)})
        checks[name] = {
            "valid": not any(r["severity"] == VIOLATION for r in mine),
            "violations": sum(r["count"] for r in mine if r["severity"] == VIOLATION),
            "info": sum(r["count"] for r in mine if r["severity"] == INFO),
            "kinds": kinds,
        }
        if name == "history" and not res.history_stats:
            checks[name]["skipped"] = "no history given"
    return {
        "valid": res.valid,
        "engine": engine,
        "master": master,
        "duration_s": round(duration_s, 3),
        "checks": checks,
        "inputs": res.counts,
        "history": res.history_stats,
        "groups": [{"group": st.name, "committed_index": st.committed,
                    "claimed_commit": st.claimed_commit, "quorum_end": st.quorum_end,
                    "first_index": st.first_index, "segment_size": st.segment_size,
                    "shared_first_index": st.shared_first, "shared_last_index": st.shared_last,
                    "retained_first_index": st.retained_first,
                    "retained_from_position": st.retained_from,
                    # Committed ranges no replica holds or should hold: retention's.
                    "retained_away": [
                        {"first_index": gap.lo, "last_index": gap.hi,
                         "first_position": gap.pos_lo, "end_position": gap.pos_hi,
                         "removed_by": [st.replicas[r].name for r in gap.vouchers]}
                        for gap in st.retained_away],
                    # The window audited (``--from``, ``--cut``; 1 and null: the whole log).
                    "window": {"from": st.window_lo or 1, "cut": st.cut or None},
                    "replicas": len(st.replicas)} for st in res.groups.values()],
        "replicas": replica_rows(res),
        "timings_s": {k: round(v, 3) for k, v in res.timings.items()},
    }


def svg_bars(title: str, labels: list[str], values: list[float], colors: list[str] | None = None,
             log: bool = False) -> str:
    """A horizontal bar chart as a self-contained SVG document (no plotting library).

    Hand-written SVG keeps the report free of matplotlib's import and
    rendering time, which was a visible share of a fast audit.
    """
    e = html.escape
    row, width = 22, 420
    left = 16 + 7 * max((len(label) for label in labels), default=10)  # ~7 px a character
    height = 40 + row * max(1, len(labels))

    def scale(v: float) -> float:
        return math.log10(1 + v) if log else v

    top = max((scale(v) for v in values), default=0) or 1
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{left + width + 90}' "
             f"height='{height}' font-family='sans-serif' font-size='12'>",
             f"<text x='4' y='16' font-size='14' font-weight='bold'>{e(title)}</text>"]
    if not labels:
        parts.append("<text x='4' y='40'>no anomalies</text>")
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        y = 28 + i * row
        w = max(1.0, width * scale(v) / top) if v else 0.0
        color = colors[i] if colors else "#4477aa"
        parts.append(f"<text x='{left - 6}' y='{y + 14}' text-anchor='end'>{e(label)}</text>"
                     f"<rect x='{left}' y='{y + 3}' width='{w:.1f}' height='{row - 6}' "
                     f"fill='{color}'/><text x='{left + w + 4:.1f}' y='{y + 14}'>{v:,}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _plots(summary: dict[str, Any]) -> list[tuple[str, str]]:
    reps = summary["replicas"]
    labels = [f"{r['group']}/{r['replica']}" for r in reps]
    out = []
    for title, key in (("Entries per replica", "entries"),
                       ("Lag behind the group's longest log (entries)", "lag")):
        out.append((title, svg_bars(title, labels, [r[key] for r in reps])))
    kinds = [(f"{c}/{k}", v["count"], v["severity"]) for c, d in summary["checks"].items()
             for k, v in d["kinds"].items()]
    title = "Anomalies by kind (red: violation, grey: info; log scale)"
    out.append(("Anomalies by kind", svg_bars(
        title, [k[0] for k in kinds], [k[1] for k in kinds],
        ["#cc3311" if k[2] == VIOLATION else "#bbbbbb" for k in kinds], log=True)))
    return out


def _away(group: dict[str, Any]) -> str:
    """A group's retained-away index ranges, as ``a..b, c..d`` (empty for none)."""
    return ", ".join(f"{r['first_index']}..{r['last_index']}" for r in group["retained_away"])


def retained_away_text(group: dict[str, Any]) -> str:
    """``; retained away a..b`` for a summary group that has such ranges, else ``""``."""
    away = _away(group)
    return f"; retained away {away}" if away else ""


def write_html(summary: dict[str, Any], path: str) -> None:
    e = html.escape
    verdict = "PASS" if summary["valid"] else "FAIL"
    parts = [f"<!doctype html><meta charset=utf-8><title>LedgerMQ audit: {verdict}</title>",
             "<style>body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;"
             "padding:3px 6px}table{border-collapse:collapse}.fail{color:#c31}.pass{color:#171}"
             "</style>",
             f"<h1>LedgerMQ audit: <span class={verdict.lower()}>{verdict}</span></h1>",
             f"<p>{summary['inputs']['groups']} groups, {summary['inputs']['replicas']} "
             f"replicas, {summary['inputs']['files']} files, {summary['inputs']['bytes']:,} "
             f"bytes, {summary['inputs'].get('entries', 0):,} entries, "
             f"{summary['inputs'].get('messages', 0):,} messages; engine "
             f"{e(summary['engine'])} ({e(summary['master'])}), {summary['duration_s']} s.</p>",
             "<h2>Checks</h2><table><tr><th>check</th><th>result</th><th>violations</th>"
             "<th>info</th><th>kinds</th></tr>"]
    for name, c in summary["checks"].items():
        res = "skipped" if c.get("skipped") else ("pass" if c["valid"] else "FAIL")
        kinds = ", ".join(f"{k} ({v['count']})" for k, v in c["kinds"].items())
        parts.append(f"<tr><td>{name}</td><td class={'pass' if c['valid'] else 'fail'}>"
                     f"{res}</td><td>{c['violations']}</td><td>{c['info']}</td>"
                     f"<td>{e(kinds)}</td></tr>")
    parts.append("</table><h2>Groups</h2><table><tr><th>group</th><th>committed</th>"
                 "<th>max hardstate commit</th><th>quorum end</th><th>segment size</th>"
                 "<th>shared by every replica</th><th>retained from</th>"
                 "<th>retained away (on no replica)</th></tr>")
    for g in summary["groups"]:
        shared = (f"{g['shared_first_index']}..{g['shared_last_index']}"
                  if g["shared_first_index"] else "nothing")
        parts.append(f"<tr><td>{e(g['group'])}</td><td>{g['committed_index']}</td>"
                     f"<td>{g['claimed_commit']}</td><td>{g['quorum_end']}</td>"
                     f"<td>{g['segment_size']}</td><td>{shared}</td>"
                     f"<td>index {g['retained_first_index']}, position "
                     f"{g['retained_from_position']}</td><td>{e(_away(g))}</td></tr>")
    parts.append("</table><h2>Replicas</h2><table><tr>")
    cols = ["group", "replica", "entries", "first_index", "last_index", "first_position",
            "end_position", "segments", "snapshot_index", "last_term", "agree_end",
            "first_divergent", "lag", "hardstate_commit", "durable_index"]
    parts.append("".join(f"<th>{c}</th>" for c in cols) + "</tr>")
    for r in summary["replicas"]:
        parts.append("<tr>" + "".join(f"<td>{e(str(r[c]))}</td>" for c in cols) + "</tr>")
    parts.append("</table>")
    for title, svg in _plots(summary):
        data = base64.b64encode(svg.encode()).decode()
        parts.append(f"<h2>{e(title)}</h2><img alt='{e(title)}' src='data:image/svg+xml;"
                     f"base64,{data}'>")
    parts.append("<h2>Examples</h2>")
    for name, c in summary["checks"].items():
        for kind, v in c["kinds"].items():
            parts.append(f"<h3>{name} / {e(kind)} ({v['severity']}, {v['count']})</h3><ul>")
            parts.extend(f"<li><code>{e(json.dumps(x))}</code></li>" for x in v["examples"])
            parts.append("</ul>")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(parts))


def write_outputs(res: AuditResult, out_dir: str, duration_s: float, engine: str,
                  master: str) -> dict[str, Any]:
    """Write summary.json, findings.parquet, replicas.parquet and report.html."""
    os.makedirs(out_dir, exist_ok=True)
    summary = summarize(res, duration_s, engine, master)
    pq.write_table(named_findings(res), os.path.join(out_dir, "findings.parquet"))
    pq.write_table(pa.Table.from_pylist(summary["replicas"]) if summary["replicas"]
                   else pa.table({}), os.path.join(out_dir, "replicas.parquet"))
    write_html(summary, os.path.join(out_dir, "report.html"))
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2, default=str)
    return summary
