"""The nightly audit's latest verdict, read from the NameServer's reports directory.

Where it looks (one rule, docs/audit.md "Results an operator sees"): the audit
state directory is the reports directory itself when it holds
``latest.json``, else the one subdirectory that does (``REPORTS/<name>/latest.json``,
e.g. ``--state REPORTS/audit``); several such subdirectories are an error
the answer names. ``latest.json`` is the newest ``nights/<night_id>/night.json``
copied there by ``ledgermq audit --nightly`` (schema in docs/audit.md).

It is read on every request and scrape (a few small files, no cache, no
thread) and checked before it is believed, with the same rules as the
audit's own reader (``spark_audit/nights.py``, which the NameServer may not
import; ``tests/spark_audit/nightly_state.py`` feeds both readers the same
forgeries): JSON without duplicate keys or NaN, every key with its type,
counts in 0..2^63-1, finite times not in the future, names of a safe
alphabet, run directories inside the night's, and a document consistent
with itself and identical to its night's own file. What fails is answered
as the state ``unreadable`` with the reason, never as an error of the
server.

States: ``passed``; ``failed`` (exit 1, a check failed, or 2, inputs
unreadable); ``stale`` (passed, but finished longer ago than the configured
age, 36 h by default: the nightly job has stopped running); ``unreadable``;
and no verdict at all (``NoAudit``: the API's 404).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_STALE_AFTER_S = 36 * 3600.0
FORMAT = 1
MAX_FILE_BYTES = 16 << 20
MAX_INT = (1 << 63) - 1
MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z
FUTURE_SLACK_S = 3600.0  # clocks of the auditing host and this one may disagree a little
NIGHT_ID = re.compile(r"\d{8}T\d{6}Z")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:%|@+-]{0,127}")
KIND = re.compile(r"[a-z][a-z0-9_]{0,63}")
LATEST = "latest.json"


class NoAudit(Exception):
    """No verdict to show: no reports directory, or no latest.json in it."""


class Unbelievable(ValueError):
    """A latest.json (or night.json) that cannot be believed; the message names the file."""


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


# ------------------------------------------------------------------ locating


def state_directory(reports_dir: str) -> Path:
    """The audit state directory under ``reports_dir`` (the rule above); NoAudit if
    there is none, Unbelievable if there are several."""
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
        raise Unbelievable(f"several audit state directories under {root}: "
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
    except Unbelievable as exc:
        return Verdict("unreadable", "", None, str(exc), stale_after_s, None, None, None)
    rel = state.relative_to(root).as_posix() if state != root else ""
    report = f"{rel}/index.html" if rel else "index.html"
    report_or_none = report if (state / "index.html").is_file() else None
    try:
        night = _latest(state, now)
    except Unbelievable as exc:
        return Verdict("unreadable", rel, None, str(exc), stale_after_s, None,
                       _last_success(state, now), report_or_none)
    age = now - float(night["finished"])
    passed = night["exit"] == 0
    last = float(night["finished"]) if passed else _last_success(state, now)
    status = "failed" if not passed else "stale" if age > stale_after_s else "passed"
    return Verdict(status, rel, night, None, stale_after_s, age, last, report_or_none)


def _latest(state: Path, now: float) -> dict[str, Any]:
    """latest.json, checked, and checked to be the newest night's own document."""
    path = state / LATEST
    doc = check_night(load(path), path, now)
    own_path = state / "nights" / doc["night"] / "night.json"
    try:
        own = check_night(load(own_path), own_path, now)
    except Unbelievable as exc:
        raise Unbelievable(f"{path}: its night's own file is not readable: {exc}") from None
    if own != doc:
        raise Unbelievable(f"{path}: differs from nights/{doc['night']}/night.json, of which "
                           "it must be a copy")
    for name in _night_names(state):
        if name > doc["night"] and _readable(state, name, now) is not None:
            raise Unbelievable(f"{path}: names night {doc['night']}, but {name} is newer")
    return doc


def _night_names(state: Path) -> list[str]:
    try:
        return sorted(n for n in os.listdir(state / "nights") if NIGHT_ID.fullmatch(n))
    except OSError:
        return []


def _readable(state: Path, name: str, now: float) -> dict[str, Any] | None:
    path = state / "nights" / name / "night.json"
    try:
        doc = check_night(load(path), path, now)
    except Unbelievable:
        return None
    return doc if doc["night"] == name else None


def _last_success(state: Path, now: float) -> float | None:
    """When the newest night that passed finished (nights read newest first)."""
    for name in reversed(_night_names(state)):
        doc = _readable(state, name, now)
        if doc is not None and doc["exit"] == 0:
            return float(doc["finished"])
    return None


# ------------------------------------------------------------------ checking


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def load(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; Unbelievable for anything else."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise Unbelievable(f"{path}: larger than a night file may be ({MAX_FILE_BYTES} "
                               "bytes)")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise Unbelievable(f"{path}: missing") from None
    except OSError as exc:
        raise Unbelievable(f"{path}: cannot be read: {exc}") from None
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates,
                         parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise Unbelievable(f"{path}: not UTF-8: {exc}") from None
    except RecursionError:
        raise Unbelievable(f"{path}: JSON nested too deeply") from None
    except ValueError as exc:
        raise Unbelievable(f"{path}: malformed JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise Unbelievable(f"{path}: not a JSON object")
    return doc


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Fields:
    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, what: str) -> Unbelievable:
        return Unbelievable(f"{self.path}: {where}: {what}")

    def key(self, obj: dict[str, Any], key: str, where: str) -> Any:
        if key not in obj:
            raise self.fail(where, f"missing key {key!r}")
        return obj[key]

    def count(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"must be an integer, not {_show(value)}")
        if not 0 <= value <= MAX_INT:
            raise self.fail(where, f"{value} is outside 0..2^63-1")
        return value

    def seconds(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, f"must be a number of seconds, not {_show(value)}")
        if not (math.isfinite(value) and 0 <= value <= MAX_TIME):
            raise self.fail(where, f"{value} is not a time (seconds since 1970, up to 9999)")
        return float(value)

    def time(self, value: Any, where: str, now: float) -> float:
        """A moment: also not in the future (a forged night must not stay fresh forever)."""
        t = self.seconds(value, where)
        if t > now + FUTURE_SLACK_S:
            raise self.fail(where, f"{t} is in the future (now {now:.0f})")
        return t

    def text(self, value: Any, where: str, pattern: re.Pattern[str] | None = None,
             limit: int = 200) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"must be a string, not {_show(value)}")
        if pattern is not None and not pattern.fullmatch(value):
            raise self.fail(where, f"{value[:80]!r} is not a valid name")
        if len(value) > limit or any(ord(c) < 32 for c in value):
            raise self.fail(where, f"{value[:80]!r}: over {limit} characters or control "
                                   "characters")
        return value

    def obj(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be an object, not {_show(value)}")
        return value

    def rng(self, value: Any, where: str) -> None:
        if not (isinstance(value, list) and len(value) == 2):
            raise self.fail(where, f"must be a range [first, last], not {_show(value)}")
        a, b = self.count(value[0], where), self.count(value[1], where)
        if a > b:
            raise self.fail(where, f"range [{a}, {b}] ends before it starts")

    def ranges(self, value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise self.fail(where, f"must be a list of ranges, not {_show(value)}")
        for i, v in enumerate(value):
            self.rng(v, f"{where}[{i}]")

    def findings(self, value: Any, where: str) -> dict[str, int]:
        return {self.text(k, f"{where} kind", KIND): self.count(v, f"{where}.{k}")
                for k, v in self.obj(value, where).items()}

    def run_dir(self, value: Any, where: str) -> None:
        text = self.text(value, where, limit=400)
        parts = text.split("/")
        if (not text or text.startswith("/") or "\\" in text or ":" in parts[0]
                or any(p in ("", ".", "..") for p in parts)):
            raise self.fail(where, f"{text[:80]!r} is not a directory inside the night's")


def _check_group(f: _Fields, g: dict[str, Any], where: str, now: float) -> dict[str, int]:
    def key(name: str) -> Any:
        return f.key(g, name, where)

    for name in ("cut", "verified_through", "entries_audited", "bytes_audited"):
        f.count(key(name), f"{where}.{name}")
    source = f.text(key("cut_source"), f"{where}.cut_source")
    if source not in ("admin", "files"):
        raise f.fail(f"{where}.cut_source", f"{source!r} is not one of ('admin', 'files')")
    if key("new") is not None:
        f.rng(key("new"), f"{where}.new")
    f.ranges(key("reverified"), f"{where}.reverified")
    f.ranges(key("dropped"), f"{where}.dropped")
    if key("oldest_verification") is not None:
        f.time(key("oldest_verification"), f"{where}.oldest_verification", now)
    findings = f.findings(key("findings"), f"{where}.findings")
    violations = f.count(key("violations"), f"{where}.violations")
    if violations != sum(findings.values()):
        raise f.fail(where, f"violations {violations} is not the sum of its findings "
                            f"({sum(findings.values())})")
    for name, r in f.obj(key("replicas"), f"{where}.replicas").items():
        at = f"{where}.replicas.{f.text(name, f'{where}.replicas', NAME)}"
        r = f.obj(r, at)
        for k in ("agree_end", "lag", "last_index"):
            f.count(f.key(r, k, at), f"{at}.{k}")
    runs = key("runs")
    if not isinstance(runs, list):
        raise f.fail(f"{where}.runs", f"must be a list, not {_show(runs)}")
    for i, run in enumerate(runs):
        f.run_dir(run, f"{where}.runs[{i}]")
    return findings


def check_night(doc: dict[str, Any], path: Path, now: float | None = None) -> dict[str, Any]:
    """``doc`` (parsed from ``path``) if it is a believable night; Unbelievable otherwise."""
    now = time.time() if now is None else now
    f = _Fields(path)

    def key(name: str) -> Any:
        return f.key(doc, name, "top level")

    fmt = key("format")
    if fmt != FORMAT or isinstance(fmt, bool):
        raise f.fail("format", f"{_show(fmt)} is not a format this reader knows ({FORMAT})")
    night = f.text(key("night"), "night")
    if not NIGHT_ID.fullmatch(night):
        raise f.fail("night", f"{night[:40]!r} is not a night id (YYYYMMDDTHHMMSSZ)")
    started = f.time(key("started"), "started", now)
    finished = f.time(key("finished"), "finished", now)
    if finished < started:
        raise f.fail("finished", f"{finished} is before started ({started})")
    f.seconds(key("duration_s"), "duration_s")
    valid, code = key("valid"), key("exit")
    if not isinstance(valid, bool):
        raise f.fail("valid", f"must be true or false, not {_show(valid)}")
    if isinstance(code, bool) or code not in (0, 1, 2):
        raise f.fail("exit", f"{_show(code)} is not an exit status (0, 1 or 2)")
    if valid != (code == 0):
        raise f.fail("valid", f"{valid} contradicts exit {code} (valid is exit == 0)")
    findings = f.findings(key("findings"), "findings")
    violations = f.count(key("violations"), "violations")
    if violations != sum(findings.values()):
        raise f.fail("violations", f"{violations} is not the sum of the findings "
                                   f"({sum(findings.values())})")
    if valid and violations:
        raise f.fail("valid", f"a passed night with {violations} violation(s)")
    summed: dict[str, int] = {}
    for name, g in f.obj(key("groups"), "groups").items():
        f.text(name, "groups", NAME)
        for kind, n in _check_group(f, f.obj(g, f"groups.{name}"), f"groups.{name}",
                                    now).items():
            summed[kind] = summed.get(kind, 0) + n
    if {k: v for k, v in findings.items() if v} != {k: v for k, v in summed.items() if v}:
        raise f.fail("findings", f"{findings} is not the sum of the groups' findings {summed}")
    f.text(key("engine"), "engine")
    f.text(key("master"), "master")
    for name in ("entries_audited", "bytes_audited"):
        f.count(key(name), name)
    return doc
