"""Nightly state directories for the results tests, made by running the real audit.

Each night copies the recorded real run (tests/fixtures/real-run-3n.tar.gz:
three replicas of group ``chaos`` and the client history), optionally plants
one case of the planted-corruption suite, runs ``spark_audit.cli.run`` with
the in-process engine into ``nights/<id>/runs/chaos`` and writes
``night.json`` from its summary.json in the schema the nightly runner writes
(docs/audit.md), then ``latest.json``. The ranges follow an incremental
schedule over the run's 328 entries (the first night all of them as new,
later nights re-verify halves); they are bookkeeping the audit of a fixed
copy cannot produce itself, until ``ledgermq audit --nightly`` writes them.

``FORGERIES`` are damaged or forged versions of a real night document, each
with a fragment that the refusal message of both readers (``spark_audit.nights``
and ``ledgermq.namesrv.audit_verdict``) must contain.
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_audit import cli, planted
from tests.chaos.histories import REAL_RUN

DAY = 86400.0


def night_id(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


def unpack(dest: Path) -> Path:
    """The recorded real run, unpacked once per test module."""
    return planted.unpack_base(REAL_RUN, dest)


def audit_night(base: Path, state: Path, started: float, *, case: str | None = None,
                previous: dict[str, Any] | None = None, latest: bool = True
                ) -> dict[str, Any]:
    """Audit a copy of ``base`` (with ``case`` planted) as the night starting at
    ``started``; write its night.json (and latest.json) under ``state``."""
    nid = night_id(started)
    night_dir = state / "nights" / nid
    work = night_dir.parent.parent.parent / f"work-{nid}"
    shutil.copytree(base, work)
    if case is not None:
        planted.CASES[case].plant(work / "data" / planted.GROUP)
    t0 = time.perf_counter()
    rc = cli.run([str(work / "data")], out=str(night_dir / "runs" / planted.GROUP),
                 engine="python", history=[str(work / "history.jsonl")])
    took = time.perf_counter() - t0
    shutil.rmtree(work)
    summary = json.loads((night_dir / "runs" / planted.GROUP / "summary.json").read_text())
    doc = night_doc(summary, nid, started, took, rc, previous)
    (night_dir / "night.json").write_text(json.dumps(doc, indent=1))
    if latest:
        (state / "latest.json").write_text(json.dumps(doc, indent=1))
    return doc


def night_doc(summary: dict[str, Any], nid: str, started: float, took: float, rc: int,
              previous: dict[str, Any] | None) -> dict[str, Any]:
    """night.json from one run's summary.json (one group, as in the recorded run)."""
    (group,) = summary["groups"]
    name = group["group"]
    findings: dict[str, int] = {}
    for check in summary["checks"].values():
        for kind, k in check["kinds"].items():
            if k["severity"] == "violation":
                findings[kind] = findings.get(kind, 0) + k["count"]
    cut = group["committed_index"]
    before = previous["groups"][name]["verified_through"] if previous else 0
    # Re-verify one half of what earlier nights verified, by the day's parity.
    half = before // 2
    rever = [] if not before else [[1, half]] if int(nid[6:8]) % 2 else [[half + 1, before]]
    inputs = summary["inputs"]
    g = {"cut": cut, "cut_source": "files",
         "new": [before + 1, cut] if cut > before else None,
         "reverified": rever, "dropped": [],
         "verified_through": max(cut, before),
         "oldest_verification": (previous["groups"][name]["oldest_verification"]
                                 if previous else started),
         "entries_audited": inputs["entries"], "bytes_audited": inputs["bytes"],
         "violations": sum(findings.values()), "findings": dict(findings),
         "replicas": {r["replica"]: {"agree_end": r["agree_end"], "lag": r["lag"],
                                     "last_index": r["last_index"]}
                      for r in summary["replicas"]},
         "runs": [f"runs/{name}"]}
    return {"format": 1, "night": nid, "started": started, "finished": started + took,
            "duration_s": round(took, 3), "valid": rc == 0, "exit": rc,
            "engine": "python", "master": "in-process",
            "entries_audited": inputs["entries"], "bytes_audited": inputs["bytes"],
            "violations": sum(findings.values()), "findings": findings,
            "groups": {name: g}}


def build_state(state: Path, base: Path, cases: list[str | None],
                now: float | None = None) -> list[dict[str, Any]]:
    """One night per entry of ``cases`` (None: a clean night), a day apart, the last
    starting at ``now``; returns the night documents oldest first."""
    now = time.time() if now is None else now
    docs: list[dict[str, Any]] = []
    for i, case in enumerate(cases):
        started = now - (len(cases) - 1 - i) * DAY
        docs.append(audit_night(base, state, started, case=case,
                                previous=docs[-1] if docs else None))
    return docs


# ------------------------------------------------------------------ forgeries

Forgery = Callable[[dict[str, Any]], bytes]


def _doc(change: Callable[[dict[str, Any]], None]) -> Forgery:
    def forge(doc: dict[str, Any]) -> bytes:
        d = copy.deepcopy(doc)
        change(d)
        return json.dumps(d).encode()

    return forge


def _group(doc: dict[str, Any]) -> dict[str, Any]:
    return next(iter(doc["groups"].values()))


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        *head, last = path.split(".")
        at = d
        for key in head:
            at = _group(at) if key == "*" else at[key]
        at[last] = value

    return change


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.pop(key)


def _rename_group(new: str) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        (old,) = d["groups"]
        d["groups"] = {new: d["groups"][old]}

    return change


def _claim_pass(d: dict[str, Any]) -> None:
    d["valid"], d["exit"] = True, 0  # a failed night made to look passed


def _inflate(d: dict[str, Any]) -> None:
    d["findings"] = {k: v + 1 for k, v in d["findings"].items()} or {"body_crc": 1}
    d["violations"] = sum(d["findings"].values())


# name -> (forgery of a real night document, fragment every refusal message contains)
FORGERIES: dict[str, tuple[Forgery, str]] = {
    "truncated": (lambda d: json.dumps(d).encode()[:200], "malformed JSON"),
    "not_utf8": (lambda d: b"\xff\xfe" + json.dumps(d).encode(), "UTF-8"),
    "not_an_object": (lambda d: b"[1, 2, 3]", "not a JSON object"),
    "duplicate_key": (lambda d: json.dumps(d).encode()[:-1] + b', "exit": 0}',
                      "duplicate key 'exit'"),
    "nan_duration": (lambda d: json.dumps({**d, "duration_s": float("nan")}).encode(),
                     "NaN"),
    "infinite_time": (lambda d: json.dumps(d).encode().replace(
        b'"started": ', b'"started": 1e999, "x": ', 1), "started"),
    "deep_nesting": (lambda d: b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "missing_exit": (_doc(_drop("exit")), "'exit'"),
    "format_2": (_doc(_set("format", 2)), "format"),
    "bad_night_id": (_doc(_set("night", "2026-11-24")), "night"),
    "bool_count": (_doc(_set("entries_audited", True)), "entries_audited"),
    "negative_bytes": (_doc(_set("bytes_audited", -1)), "bytes_audited"),
    "huge_violations": (_doc(_set("violations", 1 << 64)), "violations"),
    "string_time": (_doc(_set("finished", "yesterday")), "finished"),
    "finished_first": (_doc(_set("finished", 1.0)), "finished"),
    "from_the_future": (_doc(lambda d: d.update(finished=d["started"] + 10 * 365 * DAY)),
                        "in the future"),
    "valid_but_exit_1": (_doc(_set("valid", True)), "exit"),
    "failed_claims_pass": (_doc(_claim_pass), "violation"),
    "findings_not_summed": (_doc(_inflate), "findings"),
    "script_kind": (_doc(_set("*.findings", {"<script>": 0})), "<script>"),
    "group_name_path": (_doc(_rename_group("../../etc")), "../../etc"),
    "range_backwards": (_doc(_set("*.new", [10, 5])), "ends before it starts"),
    "range_not_pair": (_doc(_set("*.reverified", [[1, 2, 3]])), "reverified"),
    "run_escapes": (_doc(_set("*.runs", ["../../../etc"])), "runs"),
    "run_absolute": (_doc(_set("*.runs", ["/etc"])), "runs"),
    "cut_source_bad": (_doc(_set("*.cut_source", "guess")), "cut_source"),
    "replica_lag_negative": (_doc(lambda d: next(iter(_group(d)["replicas"].values())).update(
        lag=-3)), "lag"),
    "exit_3": (_doc(_set("exit", 3)), "exit"),
}
