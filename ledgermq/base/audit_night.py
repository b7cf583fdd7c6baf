"""The nightly audit's ``night.json`` and ``latest.json``: their format, and when to believe one.

This module is the contract between the nightly audit that writes these files
(``ledgermq audit --nightly --state DIR``: ``DIR/nights/<night_id>/night.json``
per night, then ``DIR/latest.json``, a copy of the newest) and the readers
that act on them: the cross-night report (``spark_audit/nights.py``) and the
NameServer's verdict (``ledgermq/namesrv/audit_verdict.py``). It stands on the
ground floor because both may import it and neither may import the other
(the audit may not import the product, nor the product the audit);
docs/audit.md, "Nightly audits", gives the schema and "Believing a night" the
rules below. What is left in each reader is its own: the report's listing of
every night, the NameServer's locating of the state directory and its verdict.

A file is a claim about the cluster's health that an operator will act on,
so it is checked before it is believed: well-formed JSON (UTF-8, at most
``MAX_FILE_BYTES``, no duplicate keys, no NaN or Infinity), every key present
with its type, counts that are non-negative 64-bit integers, finite times not
in the future, ranges ``[first, last]`` with first <= last, names and kinds of
a safe alphabet (they end up in HTML and metric labels), run directories
inside the night's directory, and the document consistent with itself
(``valid`` is ``exit == 0``, a passed night has no violation, violations are
the sum of the findings, the night's findings the sum of its groups', a
night's id is its directory's name). ``read_latest`` adds the rule for
``latest.json``: it is the newest finished night's own file. A file that
fails raises ``NightError`` with a message naming it and what is wrong.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1
MAX_FILE_BYTES = 16 << 20  # a night of many groups is a few hundred KB
MAX_INT = (1 << 63) - 1
MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z
FUTURE_SLACK_S = 3600.0  # clocks of the auditing host and the reader may disagree a little
NIGHT_ID = re.compile(r"\d{8}T\d{6}Z")
# Group and replica names (the brokers' names, data directories' base names).
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:%|@+-]{0,127}")
KIND = re.compile(r"[a-z][a-z0-9_]{0,63}")
EXITS = (0, 1, 2)
CUT_SOURCES = ("admin", "files")
LATEST = "latest.json"


class NightError(ValueError):
    """A night.json or latest.json that cannot be believed; the message names the file."""


Range = tuple[int, int]


@dataclass(frozen=True)
class Replica:
    agree_end: int
    lag: int
    last_index: int


@dataclass(frozen=True)
class GroupNight:
    """One group's part of a night (the schema's ``groups.<group>``)."""

    cut: int
    cut_source: str
    new: Range | None
    reverified: list[Range]
    dropped: list[Range]
    verified_through: int
    oldest_verification: float | None
    entries_audited: int
    bytes_audited: int
    violations: int
    findings: dict[str, int]
    replicas: dict[str, Replica]
    runs: list[str]

    @property
    def new_indexes(self) -> int:
        """Raft indexes of tonight's new range."""
        return 0 if self.new is None else self.new[1] - self.new[0] + 1

    @property
    def reverified_indexes(self) -> int:
        return sum(b - a + 1 for a, b in self.reverified)


@dataclass(frozen=True)
class Night:
    """One believed night.json; ``doc`` is the document as read."""

    night: str
    started: float
    finished: float
    duration_s: float
    valid: bool
    exit: int
    engine: str
    master: str
    entries_audited: int
    bytes_audited: int
    violations: int
    findings: dict[str, int]
    groups: dict[str, GroupNight]
    doc: dict[str, Any] = field(repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return self.exit == 0


def night_file(state: Path, night_id: str) -> Path:
    """Where the night ``night_id`` of the state directory ``state`` keeps its night.json."""
    return state / "nights" / night_id / "night.json"


def night_ids(state: Path) -> list[str]:
    """The night ids among the directories under ``state/nights``, oldest first."""
    try:
        return sorted(n for n in os.listdir(state / "nights") if NIGHT_ID.fullmatch(n))
    except OSError:
        return []


# ------------------------------------------------------------------ parsing


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A second "exit": 0 would otherwise silently win over the first.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def load_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; NightError for anything else."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise NightError(f"{path}: {size} bytes, more than a night file may hold "
                             f"({MAX_FILE_BYTES})")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise NightError(f"{path}: missing") from None
    except OSError as exc:
        raise NightError(f"{path}: cannot be read: {exc}") from None
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates,
                         parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise NightError(f"{path}: not UTF-8: {exc}") from None
    except RecursionError:
        raise NightError(f"{path}: JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, duplicates, NaN, over-long integers
        raise NightError(f"{path}: malformed JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise NightError(f"{path}: not a JSON object")
    return doc


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Check:
    """Field checks that name the file and the key path in their errors."""

    def __init__(self, path: Path, now: float) -> None:
        self.path = path
        self.now = now

    def fail(self, where: str, what: str) -> NightError:
        return NightError(f"{self.path}: {where}: {what}")

    def get(self, obj: dict[str, Any], key: str, where: str) -> Any:
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

    def time(self, value: Any, where: str) -> float:
        """A moment: also not in the future (a forged night must not stay fresh forever)."""
        t = self.seconds(value, where)
        if t > self.now + FUTURE_SLACK_S:
            raise self.fail(where, f"{t} is in the future (now {self.now:.0f})")
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

    def rng(self, value: Any, where: str) -> Range:
        if not (isinstance(value, list) and len(value) == 2):
            raise self.fail(where, f"must be a range [first, last], not {_show(value)}")
        a, b = self.count(value[0], where), self.count(value[1], where)
        if a > b:
            raise self.fail(where, f"range [{a}, {b}] ends before it starts")
        return a, b

    def ranges(self, value: Any, where: str) -> list[Range]:
        if not isinstance(value, list):
            raise self.fail(where, f"must be a list of ranges, not {_show(value)}")
        return [self.rng(v, f"{where}[{i}]") for i, v in enumerate(value)]

    def findings(self, value: Any, where: str) -> dict[str, int]:
        return {self.text(k, f"{where} kind", KIND): self.count(v, f"{where}.{k}")
                for k, v in self.obj(value, where).items()}

    def run_dir(self, value: Any, where: str) -> str:
        """A run's output directory: relative, inside the night's directory."""
        text = self.text(value, where, limit=400)
        parts = text.split("/")
        if (not text or text.startswith("/") or "\\" in text or ":" in parts[0]
                or any(p in ("", ".", "..") for p in parts)):
            raise self.fail(where, f"{text[:80]!r} is not a directory inside the night's")
        return text


def _group(c: _Check, g: dict[str, Any], where: str) -> GroupNight:
    def get(key: str) -> Any:
        return c.get(g, key, where)

    new = get("new")
    oldest = get("oldest_verification")
    findings = c.findings(get("findings"), f"{where}.findings")
    violations = c.count(get("violations"), f"{where}.violations")
    if violations != sum(findings.values()):
        raise c.fail(where, f"violations {violations} is not the sum of its findings "
                            f"({sum(findings.values())})")
    replicas = {}
    for name, r in c.obj(get("replicas"), f"{where}.replicas").items():
        at = f"{where}.replicas.{c.text(name, f'{where}.replicas', NAME)}"
        r = c.obj(r, at)
        replicas[name] = Replica(*(c.count(c.get(r, k, at), f"{at}.{k}")
                                   for k in ("agree_end", "lag", "last_index")))
    runs = get("runs")
    if not isinstance(runs, list):
        raise c.fail(f"{where}.runs", f"must be a list, not {_show(runs)}")
    cut_source = c.text(get("cut_source"), f"{where}.cut_source")
    if cut_source not in CUT_SOURCES:
        raise c.fail(f"{where}.cut_source", f"{cut_source!r} is not one of {CUT_SOURCES}")
    return GroupNight(
        cut=c.count(get("cut"), f"{where}.cut"), cut_source=cut_source,
        new=None if new is None else c.rng(new, f"{where}.new"),
        reverified=c.ranges(get("reverified"), f"{where}.reverified"),
        dropped=c.ranges(get("dropped"), f"{where}.dropped"),
        verified_through=c.count(get("verified_through"), f"{where}.verified_through"),
        oldest_verification=None if oldest is None
        else c.time(oldest, f"{where}.oldest_verification"),
        entries_audited=c.count(get("entries_audited"), f"{where}.entries_audited"),
        bytes_audited=c.count(get("bytes_audited"), f"{where}.bytes_audited"),
        violations=violations, findings=findings, replicas=replicas,
        runs=[c.run_dir(r, f"{where}.runs[{i}]") for i, r in enumerate(runs)])


def parse_night(doc: dict[str, Any], path: Path, now: float | None = None) -> Night:
    """Check one night document (already parsed from ``path``, named in errors);
    ``now`` (default the clock) is what "in the future" is measured against."""
    c = _Check(path, time.time() if now is None else now)

    def get(key: str) -> Any:
        return c.get(doc, key, "top level")

    fmt = get("format")
    if fmt != FORMAT or isinstance(fmt, bool):
        raise c.fail("format", f"{_show(fmt)} is not a format this reader knows ({FORMAT})")
    night = c.text(get("night"), "night")
    if not NIGHT_ID.fullmatch(night):
        raise c.fail("night", f"{night[:40]!r} is not a night id (YYYYMMDDTHHMMSSZ)")
    started, finished = c.time(get("started"), "started"), c.time(get("finished"), "finished")
    if finished < started:
        raise c.fail("finished", f"{finished} is before started ({started})")
    duration = c.seconds(get("duration_s"), "duration_s")
    valid, code = get("valid"), get("exit")
    if not isinstance(valid, bool):
        raise c.fail("valid", f"must be true or false, not {_show(valid)}")
    if isinstance(code, bool) or code not in EXITS:
        raise c.fail("exit", f"{_show(code)} is not an exit status (0, 1 or 2)")
    if valid != (code == 0):
        raise c.fail("valid", f"{valid} contradicts exit {code} (valid is exit == 0)")
    findings = c.findings(get("findings"), "findings")
    violations = c.count(get("violations"), "violations")
    if violations != sum(findings.values()):
        raise c.fail("violations", f"{violations} is not the sum of the findings "
                                   f"({sum(findings.values())})")
    if valid and violations:
        raise c.fail("valid", f"a passed night with {violations} violation(s)")
    groups = {c.text(name, "groups", NAME): _group(c, c.obj(g, f"groups.{name}"),
                                                  f"groups.{name}")
              for name, g in c.obj(get("groups"), "groups").items()}
    summed: dict[str, int] = {}
    for g in groups.values():
        for kind, n in g.findings.items():
            summed[kind] = summed.get(kind, 0) + n
    if {k: v for k, v in findings.items() if v} != {k: v for k, v in summed.items() if v}:
        raise c.fail("findings", f"{findings} is not the sum of the groups' findings {summed}")
    return Night(
        night=night, started=started, finished=finished, duration_s=duration, valid=valid,
        exit=code, engine=c.text(get("engine"), "engine"), master=c.text(get("master"), "master"),
        entries_audited=c.count(get("entries_audited"), "entries_audited"),
        bytes_audited=c.count(get("bytes_audited"), "bytes_audited"),
        violations=violations, findings=findings, groups=groups, doc=doc)


def read_night(path: Path, night_id: str | None = None, now: float | None = None) -> Night:
    """The night in ``path``; with ``night_id``, it must be that night (its directory)."""
    night = parse_night(load_json(path), path, now)
    if night_id is not None and night.night != night_id:
        raise NightError(f"{path}: says night {night.night!r} but lies in {night_id!r}'s "
                         "directory")
    return night


def read_latest(state: Path, own: Callable[[str], Night] | None = None,
                now: float | None = None) -> Night:
    """``state/latest.json``, believed only as the newest finished night's own document.

    ``own(night_id)`` is that night's night.json as the caller read it (NightError
    when unreadable); by default it is read here. A newer night still running has
    no night.json yet: only a finished one makes latest.json out of date (a run
    that died between the two writes, or an older night's file put back)."""
    def read_own(night_id: str) -> Night:
        return read_night(night_file(state, night_id), night_id, now)

    reader = read_own if own is None else own
    path = state / LATEST
    latest = read_night(path, now=now)
    try:
        mine = reader(latest.night)
    except NightError as exc:
        raise NightError(f"{path}: night {latest.night} has no readable "
                         f"nights/{latest.night}/night.json ({exc})") from None
    if mine.doc != latest.doc:
        raise NightError(f"{path}: differs from nights/{latest.night}/night.json, of which "
                         "it must be a copy")
    for night_id in reversed(night_ids(state)):
        if night_id <= latest.night:
            break
        try:
            reader(night_id)
        except NightError:
            continue
        raise NightError(f"{path}: names night {latest.night}, but {night_id} is newer")
    return latest
