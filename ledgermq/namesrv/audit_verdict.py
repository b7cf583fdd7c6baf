"""The nightly audit's latest verdict, read from the NameServer's reports directory.

Where it looks (one rule, docs/audit.md "Results an operator sees"): the audit
state directory is the reports directory itself when it holds
``latest.json``, else the one subdirectory that does (``REPORTS/<name>/latest.json``,
e.g. ``--state REPORTS/audit``); several such subdirectories are an error
the answer names. ``latest.json`` is the newest ``nights/<night_id>/night.json``
copied there by ``ledgermq audit --nightly`` (schema in docs/audit.md).

It is read on every request and scrape (a few small files, no cache, no
thread) and checked before it is believed, with the rules the nightly
audit's own report applies (``ledgermq.base.audit_night``, the contract
both share: strict JSON, every key with its type, counts in 0..2^63-1,
finite times not in the future, names of a safe alphabet, run directories
inside the night's, a document consistent with itself and identical to the
newest finished night's own file). What fails is answered as the state
``unreadable`` with the reason, never as an error of the server.

States: ``passed``; ``failed`` (exit 1, a check failed, or 2, inputs
unreadable); ``stale`` (passed, but finished longer ago than the configured
age, 36 h by default: the nightly job has stopped running); ``unreadable``;
and no verdict at all (``NoAudit``: the API's 404).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledgermq.base.audit_night import (
    LATEST,
    NightError,
    night_file,
    night_ids,
    read_latest,
    read_night,
)

DEFAULT_STALE_AFTER_S = 36 * 3600.0


class NoAudit(Exception):
    """No verdict to show: no reports directory, or no latest.json in it."""


class Ambiguous(ValueError):
    """Several audit state directories under the reports directory: which is meant is
    not guessed."""


@dataclass(frozen=True)
class Verdict:
    """What /api/v1/audit answers and /metrics exports."""

    state: str  # passed, failed, stale, unreadable
    directory: str  # the state directory, relative to the reports directory ("" itself)
    night: dict[str, Any] | None  # the checked latest.json (None when unreadable)
    problem: str | None
    stale_after_s: float
    age_s: float | None
    last_success: float | None  # when the newest night that passed finished
    report: str | None  # index.html under /reports/, when it exists

    def to_json(self) -> dict[str, Any]:
        rel = f"{self.directory}/" if self.directory else ""
        return {"state": self.state, "stale": self.state == "stale",
                "stale_after_s": self.stale_after_s, "age_s": self.age_s,
                "directory": self.directory, "latest": f"{rel}{LATEST}",
                "report": self.report, "last_success": self.last_success,
                "problem": self.problem, "verdict": self.night}


def state_directory(reports_dir: str) -> Path:
    """The audit state directory under ``reports_dir`` (the rule above); NoAudit if
    there is none, Ambiguous if there are several."""
    if not reports_dir:
        raise NoAudit("no reports directory is configured (--reports-dir), so no audit "
                      "verdict")
    root = Path(reports_dir)
    if (root / LATEST).is_file():
        return root
    try:
        below = sorted(p for p in root.iterdir() if (p / LATEST).is_file())
    except OSError as exc:
        raise NoAudit(f"the reports directory {reports_dir} cannot be listed: {exc}") from None
    if not below:
        raise NoAudit(f"no audit verdict: neither {root / LATEST} nor {root}/*/{LATEST} "
                      "exists (ledgermq audit --nightly --state writes it)")
    if len(below) > 1:
        raise Ambiguous(f"several audit state directories under {root}: "
                        f"{', '.join(p.name for p in below)}; keep one, or point "
                        "--reports-dir at the one to show")
    return below[0]


def read_verdict(reports_dir: str, stale_after_s: float = DEFAULT_STALE_AFTER_S,
                 now: float | None = None) -> Verdict:
    """The latest verdict under ``reports_dir``; NoAudit when there is none."""
    now = time.time() if now is None else now
    root = Path(reports_dir)
    try:
        state = state_directory(reports_dir)
    except Ambiguous as exc:
        return Verdict("unreadable", "", None, str(exc), stale_after_s, None, None, None)
    rel = state.relative_to(root).as_posix() if state != root else ""
    report = f"{rel}/index.html" if rel else "index.html"
    report_or_none = report if (state / "index.html").is_file() else None
    try:
        latest = read_latest(state, now=now)
    except NightError as exc:
        return Verdict("unreadable", rel, None, str(exc), stale_after_s, None,
                       _last_success(state, now), report_or_none)
    age = now - latest.finished
    last = latest.finished if latest.passed else _last_success(state, now)
    status = ("failed" if not latest.passed else "stale" if age > stale_after_s
              else "passed")
    return Verdict(status, rel, latest.doc, None, stale_after_s, age, last, report_or_none)


def _last_success(state: Path, now: float) -> float | None:
    """When the newest night that passed finished (nights read newest first)."""
    for name in reversed(night_ids(state)):
        try:
            night = read_night(night_file(state, name), name, now)
        except NightError:
            continue
        if night.passed:
            return night.finished
    return None
