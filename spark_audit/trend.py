"""Results an operator sees: the cross-night report and the metrics of the latest verdict.

``write_outputs(DIR)`` reads the nightly state directory (``nights``: every
``nights/<night_id>/night.json`` and ``latest.json``, each checked before it
is believed, by the rules of ``ledgermq.base.audit_night``) and writes, each
atomically (a temporary file renamed over the old one):

- ``DIR/index.html``: one self-contained page: the latest verdict, the plots
  of the last nights (``trend_plots``, SVG embedded as data URIs) and a table
  of every night (verdict, time, data read, findings, per group the cut and
  the ranges new, re-verified and dropped, links to its run reports). A night
  whose file is missing, malformed or forged stays in the table, marked
  unreadable with the reason, and shaded in the plots.
- ``DIR/audit.prom``: the latest verdict as Prometheus gauges in the text
  format (prometheus_client's ``write_to_textfile`` on a private registry),
  for node_exporter's textfile collector. The NameServer exports the same
  names on its own /metrics (docs/audit.md, "Results an operator sees").

The nightly runner calls it after each night; ``python -m spark_audit.trend DIR``
rewrites both by hand.
"""

from __future__ import annotations

import argparse
import base64
import html
import os
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

from ledgermq.base.audit_night import GroupNight, Night, Range
from spark_audit import trend_plots
from spark_audit.nights import NightRow, State, read_state

DEFAULT_MAX_NIGHTS = 90  # nights in the plots; the table lists every night
INDEX, PROM = "index.html", "audit.prom"


def write_outputs(state_dir: str, *, max_nights: int = DEFAULT_MAX_NIGHTS) -> None:
    """Write ``index.html`` and ``audit.prom`` of the state directory ``state_dir``."""
    state = read_state(state_dir)
    for row in state.nights:
        if row.error:
            print(f"audit trend: unreadable night: {row.error}", file=sys.stderr)
    if state.latest_error:
        print(f"audit trend: {state.latest_error}", file=sys.stderr)
    root = Path(state_dir)
    _atomic_write(root / INDEX, page(state, max_nights))
    write_to_textfile(str(root / PROM), metrics(state))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------ metrics


def metrics(state: State) -> CollectorRegistry:
    """The latest verdict as gauges, in a registry of their own."""
    reg = CollectorRegistry(auto_describe=False)

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=reg)

    gauge("ledgermq_audit_unreadable_nights",
          "Night directories whose night.json is missing, malformed or forged."
          ).set(sum(1 for r in state.nights if r.night is None))
    success = state.last_success
    gauge("ledgermq_audit_last_success_timestamp_seconds",
          "When the newest night that passed finished (seconds since the epoch; 0: none)."
          ).set(success.finished if success else 0)
    if not state.latest_present:
        return reg
    latest = state.latest
    gauge("ledgermq_audit_latest_readable",
          "1 when latest.json was read and believed, 0 when it was refused."
          ).set(1 if latest else 0)
    passed = gauge("ledgermq_audit_passed",
                   "1 when the latest night passed, else 0 (also when latest.json is "
                   "unreadable).")
    passed.set(1 if latest and latest.passed else 0)
    if latest is None:
        return reg
    gauge("ledgermq_audit_last_run_timestamp_seconds",
          "When the latest night finished (seconds since the epoch).").set(latest.finished)
    gauge("ledgermq_audit_exit_code",
          "Exit status of the latest night: 0 passed, 1 a check failed, 2 inputs "
          "unreadable.").set(latest.exit)
    gauge("ledgermq_audit_entries_audited",
          "Entries the latest night read, all groups and replicas.").set(latest.entries_audited)
    gauge("ledgermq_audit_bytes_audited",
          "Bytes the latest night read, all groups and replicas.").set(latest.bytes_audited)
    gauge("ledgermq_audit_duration_seconds",
          "How long the latest night took.").set(latest.duration_s)
    findings = gauge("ledgermq_audit_findings",
                     "Violations of each kind in the latest night, all groups.", ("kind",))
    for kind, n in sorted(latest.findings.items()):
        findings.labels(kind).set(n)
    per_group = gauge("ledgermq_audit_group_findings",
                      "Violations of each kind in the latest night, per group.",
                      ("group", "kind"))
    through = gauge("ledgermq_audit_verified_through",
                    "The highest Raft index of the group verified so far.", ("group",))
    oldest = gauge("ledgermq_audit_oldest_verification_timestamp_seconds",
                   "The oldest last-verified time of any range the group's manifest keeps.",
                   ("group",))
    for name, g in sorted(latest.groups.items()):
        for kind, n in sorted(g.findings.items()):
            per_group.labels(name, kind).set(n)
        through.labels(name).set(g.verified_through)
        if g.oldest_verification is not None:
            oldest.labels(name).set(g.oldest_verification)
    return reg


# ------------------------------------------------------------------ page

_E = html.escape
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em 2em;color:#1d2430}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:1.6em}
table{border-collapse:collapse} td,th{border:1px solid #d9dee7;padding:3px 7px;
vertical-align:top;text-align:left;font-variant-numeric:tabular-nums}
th{background:#f3f4f6} .verdict{padding:.7em 1em;border-radius:6px;color:#fff;margin:1em 0}
.passed{background:#2e7d32} .failed{background:#c62828} .unreadable{background:#b45309}
.none{background:#6b7280} td.passed,td.failed,td.unreadable,td.none{color:#fff;
font-weight:600} .muted{color:#6b7280;font-size:12px} img{max-width:100%}
code{font-size:12px}
"""


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _secs(s: float) -> str:
    return f"{s:.2f} s" if s < 10 else f"{s:,.0f} s"


def _ranges(rs: list[Range]) -> str:
    return ", ".join(f"{a}..{b}" for a, b in rs) or "-"


def _kinds(findings: dict[str, int]) -> str:
    return ", ".join(f"{k} {n:,}" for k, n in sorted(findings.items()) if n) or "none"


def _verdict_word(n: Night) -> tuple[str, str]:
    """(css class, word) of a night's verdict."""
    if n.passed:
        return "passed", "PASSED"
    return "failed", "FAILED" if n.exit == 1 else "INPUTS UNREADABLE"


def _banner(state: State) -> str:
    latest = state.latest
    if latest is None:
        if state.latest_error:
            return (f"<div class='verdict unreadable' id=verdict data-state=unreadable>"
                    f"latest verdict unreadable: {_E(state.latest_error)}</div>")
        return ("<div class='verdict none' id=verdict data-state=none>no audit night yet"
                "</div>")
    css, word = _verdict_word(latest)
    return (f"<div class='verdict {css}' id=verdict data-state={css}><b>{word}</b> "
            f"night {_E(latest.night)} (finished {_utc(latest.finished)}, "
            f"{_secs(latest.duration_s)}): {len(latest.groups)} group(s), "
            f"{latest.entries_audited:,} entries and {latest.bytes_audited:,} bytes read; "
            f"violations: {_E(_kinds(latest.findings))}</div>")


def _run_links(root: Path, night_id: str, g: GroupNight) -> str:
    links = []
    for run in g.runs:
        rel = f"nights/{night_id}/{run}"
        if (root / rel / "report.html").is_file():
            links.append(f"<a href='{_E(rel)}/report.html'>{_E(run)}</a>")
        else:
            links.append(f"{_E(run)} <span class=muted>(no report.html)</span>")
    return "<br>".join(links) or "-"


def _night_rows(root: Path, row: NightRow) -> str:
    if row.night is None:
        return (f"<tr data-night='{_E(row.night_id)}' data-verdict=unreadable>"
                f"<td>{_E(row.night_id)}</td><td class=unreadable>UNREADABLE</td>"
                f"<td colspan=12><code>{_E(row.error or '')}</code></td></tr>")
    n = row.night
    css, word = _verdict_word(n)
    groups: list[tuple[str, GroupNight | None]] = [*sorted(n.groups.items())] or [("", None)]
    span = f" rowspan={len(groups)}" if len(groups) > 1 else ""
    head = (f"<td{span}><a href='nights/{_E(n.night)}/night.json'>{_E(n.night)}</a></td>"
            f"<td class={css}{span}>{word}</td>"
            f"<td{span}>{time.strftime('%Y-%m-%d %H:%M', time.gmtime(n.finished))}</td>"
            f"<td{span}>{_secs(n.duration_s)}</td><td{span}>{n.entries_audited:,}</td>"
            f"<td{span}>{n.bytes_audited:,}</td><td{span}>{_E(_kinds(n.findings))}</td>")
    out = []
    for i, (name, g) in enumerate(groups):
        cells = ("<td colspan=7>no group audited</td>" if g is None else
                 f"<td>{_E(name)}</td><td>{g.cut:,} ({_E(g.cut_source)})</td>"
                 f"<td>{_ranges([g.new] if g.new else [])}</td><td>{_ranges(g.reverified)}</td>"
                 f"<td>{_ranges(g.dropped)}</td><td>{g.verified_through:,}</td>"
                 f"<td>{_run_links(root, n.night, g)}</td>")
        out.append(f"<tr data-night='{_E(n.night)}' data-verdict={css}>"
                   f"{head if i == 0 else ''}{cells}</tr>")
    return "\n".join(out)


def page(state: State, max_nights: int = DEFAULT_MAX_NIGHTS) -> str:
    """The whole index.html."""
    rows = state.nights
    shown = rows[-max_nights:] if max_nights > 0 else rows
    bad = [r for r in rows if r.night is None]
    parts = ["<!doctype html><html lang=en><meta charset=utf-8>",
             "<title>LedgerMQ nightly audit</title>", f"<style>{_STYLE}</style>",
             "<h1>LedgerMQ nightly audit</h1>", _banner(state),
             f"<p class=muted>{len(rows)} night(s) in {_E(str(state.directory))}; "
             f"written {_utc(time.time())}.</p>"]
    if bad:
        parts.append(f"<p class=unreadable-count><b>{len(bad)} unreadable night(s)</b>, "
                     "listed in the table with the reason.</p>")
    if shown:
        parts.append(f"<h2>The last {len(shown)} night(s)</h2>")
        for title, svg in trend_plots.all_plots(shown):
            data = base64.b64encode(svg.encode()).decode()
            parts.append(f"<h3>{_E(title)}</h3><img alt='{_E(title)}' data-plot='{_E(title)}'"
                         f" src='data:image/svg+xml;base64,{data}'>")
    parts.append("<h2>Nights</h2><table id=nights><thead><tr><th>night</th><th>verdict</th>"
                 "<th>finished (UTC)</th><th>took</th><th>entries</th><th>bytes</th>"
                 "<th>violations</th><th>group</th><th>cut</th><th>new</th>"
                 "<th>re-verified</th><th>dropped</th><th>verified through</th>"
                 "<th>run reports</th></tr></thead><tbody>")
    parts.extend(_night_rows(state.directory, r) for r in reversed(rows))
    parts.append("</tbody></table></html>\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark_audit.trend", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("state_dir", help="the nightly state directory (ledgermq audit --state)")
    p.add_argument("--max-nights", type=int, default=DEFAULT_MAX_NIGHTS,
                   help=f"nights in the plots (default {DEFAULT_MAX_NIGHTS}; 0: all)")
    a = p.parse_args(argv)
    if not os.path.isdir(a.state_dir):
        print(f"audit trend: {a.state_dir}: not a directory", file=sys.stderr)
        return 2
    write_outputs(a.state_dir, max_nights=a.max_nights)
    print(f"audit trend: {a.state_dir}/{INDEX}, {a.state_dir}/{PROM}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
