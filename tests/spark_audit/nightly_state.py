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
The readers' tests forge these real documents with
``tests/ledgermq/base/night_forgeries.py``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from spark_audit import cli, planted, trend
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
    starting at ``now``, then the report (index.html, audit.prom) as the nightly
    runner writes it; returns the night documents oldest first."""
    now = time.time() if now is None else now
    docs: list[dict[str, Any]] = []
    for i, case in enumerate(cases):
        started = now - (len(cases) - 1 - i) * DAY
        docs.append(audit_night(base, state, started, case=case,
                                previous=docs[-1] if docs else None))
    trend.write_outputs(str(state))
    return docs
