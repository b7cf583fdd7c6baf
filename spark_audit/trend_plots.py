"""The plots of the cross-night report (``trend``): matplotlib figures as SVG documents.

Four figures over the last nights, one x position per night directory (an
unreadable night keeps its place, shaded red, so a gap is never hidden):
findings per night per group (stacked by kind), replica agreement per group
(each replica's agreement end against the cut, and its lag), data audited
per night (Raft indexes new and re-verified, entries and bytes) and the time
each night took. Figures are built with matplotlib's object API on the Agg
backend (no pyplot state, no display) and saved as SVG with text kept as
text, so the page stays searchable and small.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ledgermq.base.audit_night import GroupNight, Night
from spark_audit.nights import NightRow

PASSED, FAILED, UNREADABLE_INPUTS = "#2e7d32", "#c62828", "#757575"
NAN = float("nan")
# Text stays text in the SVG; ids are stable from one run to the next.
_RC: dict[Any, Any] = {"svg.fonttype": "none", "svg.hashsalt": "ledgermq-audit-trend",
                       "font.size": 9}


def _label(night_id: str) -> str:
    """20261124T023000Z -> '11-24 02:30' (the year is in the table)."""
    return f"{night_id[4:6]}-{night_id[6:8]} {night_id[9:11]}:{night_id[11:13]}"


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    return buf.getvalue()


def _x_axis(ax: Axes, rows: Sequence[NightRow]) -> None:
    """Night labels (thinned to at most 12) and a red band on each unreadable night."""
    step = max(1, math.ceil(len(rows) / 12))
    ticks = list(range(0, len(rows), step))
    ax.set_xticks(ticks, [_label(rows[i].night_id) for i in ticks], rotation=45, ha="right")
    ax.set_xlim(-0.6, len(rows) - 0.4)
    for i, r in enumerate(rows):
        if r.night is None:
            ax.axvspan(i - 0.45, i + 0.45, color=FAILED, alpha=0.15, lw=0)
    ax.grid(axis="y", alpha=0.3)


def _groups(rows: Sequence[NightRow]) -> list[str]:
    return sorted({g for r in rows if r.night for g in r.night.groups})


def _new_figure(panels: int, width: float = 9.0, height: float = 2.4) -> tuple[Figure, list[Axes]]:
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(width, 0.6 + height * panels), layout="constrained")
        axes = list(fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0])
    return fig, axes


def findings_per_group(rows: Sequence[NightRow]) -> str:
    """Stacked bars per group: violations of each kind per night."""
    groups = _groups(rows) or ["(no group)"]
    kinds = sorted({k for r in rows if r.night for g in r.night.groups.values()
                    for k in g.findings})
    colors = {k: matplotlib.colormaps["tab20"](i % 20) for i, k in enumerate(kinds)}
    fig, axes = _new_figure(len(groups))
    for ax, name in zip(axes, groups, strict=True):
        bottom = [0] * len(rows)
        for kind in kinds:
            counts = [r.night.groups[name].findings.get(kind, 0)
                      if r.night and name in r.night.groups else 0 for r in rows]
            if any(counts):
                ax.bar(range(len(rows)), counts, bottom=bottom, color=colors[kind], label=kind)
                bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
        ax.set_ylabel("violations")
        ax.set_title(f"group {name}" + ("" if any(bottom) else ": no violation"), loc="left")
        if any(bottom):
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
        _x_axis(ax, rows)
    return _svg(fig)


def _per_night(rows: Sequence[NightRow], name: str,
               get: Callable[[GroupNight], float]) -> list[float]:
    """``get`` of group ``name`` on each night; NaN (no point) where it has none."""
    return [float(get(r.night.groups[name])) if r.night and name in r.night.groups else NAN
            for r in rows]


def _replica(rep: str, field: str) -> Callable[[GroupNight], float]:
    def get(g: GroupNight) -> float:
        r = g.replicas.get(rep)
        return NAN if r is None else float(getattr(r, field))

    return get


def agreement_per_group(rows: Sequence[NightRow]) -> str:
    """Per group: the cut and each replica's agreement end; each replica's lag."""
    groups = _groups(rows) or ["(no group)"]
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(11.0, 0.6 + 2.6 * len(groups)), layout="constrained")
        grid = fig.subplots(len(groups), 2, sharex=True, squeeze=False)
    xs = range(len(rows))
    for (left, right), name in zip(grid, groups, strict=True):
        left.plot(xs, _per_night(rows, name, lambda g: g.cut), "k--", lw=1.5, label="cut")
        replicas = sorted({rep for r in rows if r.night and name in r.night.groups
                           for rep in r.night.groups[name].replicas})
        for rep in replicas:
            left.plot(xs, _per_night(rows, name, _replica(rep, "agree_end")), marker="o",
                      ms=3, lw=1, label=f"{rep} agrees to")
            right.plot(xs, _per_night(rows, name, _replica(rep, "lag")), marker="o", ms=3,
                       lw=1, label=rep)
        left.set_title(f"group {name}: agreement end vs cut (Raft index)", loc="left")
        right.set_title(f"group {name}: lag behind the longest log (entries)", loc="left")
        left.legend(loc="lower left", fontsize=7)
        if replicas:
            right.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
        for ax in (left, right):
            _x_axis(ax, rows)
    return _svg(fig)


def data_audited(rows: Sequence[NightRow]) -> str:
    """Raft indexes new and re-verified per night (all groups); entries and bytes read."""
    fig, (top, bottom) = _new_figure(2)
    nights: list[Night | None] = [r.night for r in rows]
    xs = range(len(rows))
    new = [sum(g.new_indexes for g in n.groups.values()) if n else 0 for n in nights]
    old = [sum(g.reverified_indexes for g in n.groups.values()) if n else 0 for n in nights]
    top.bar(xs, new, color="#1565c0", label="new")
    top.bar(xs, old, bottom=new, color="#90caf9", label="re-verified")
    top.set_ylabel("Raft indexes")
    top.set_title("Ranges audited per night (all groups)", loc="left")
    top.legend(loc="upper left", fontsize=7)
    bottom.bar(xs, [n.entries_audited if n else 0 for n in nights], color="#6a1b9a",
               label="entries")
    bottom.set_ylabel("entries read (all replicas)")
    twin = bottom.twinx()
    twin.plot(xs, [n.bytes_audited / 1e6 if n else float("nan") for n in nights], "o-",
              color="#ef6c00", ms=3, label="MB read")
    twin.set_ylabel("MB read")
    twin.set_ylim(bottom=0)
    bottom.set_title("Data read per night: entries (bars) and MB (line)", loc="left")
    for ax in (top, bottom):
        _x_axis(ax, rows)
    return _svg(fig)


def time_taken(rows: Sequence[NightRow]) -> str:
    """Each night's duration, coloured by its verdict."""
    fig, (ax,) = _new_figure(1, height=2.8)
    colors = [UNREADABLE_INPUTS if r.night and r.night.exit == 2 else
              PASSED if r.night and r.night.passed else FAILED for r in rows]
    ax.bar(range(len(rows)), [r.night.duration_s if r.night else 0 for r in rows],
           color=colors)
    ax.set_ylabel("seconds")
    ax.set_title("Time taken per night (green passed, red failed, grey inputs unreadable)",
                 loc="left")
    _x_axis(ax, rows)
    return _svg(fig)


def all_plots(rows: Sequence[NightRow]) -> list[tuple[str, str]]:
    """(title, SVG document) of every figure, in page order."""
    return [("Findings per night, per group", findings_per_group(rows)),
            ("Replica agreement per group", agreement_per_group(rows)),
            ("Data audited per night", data_audited(rows)),
            ("Time taken per night", time_taken(rows))]
