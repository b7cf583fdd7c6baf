"""Forged and damaged night documents, and a believable one to forge.

``FORGERIES`` turn a night document (a failed one: it has violations to
forge away) into the bytes of a file no reader may believe, each with a
fragment the refusal message must contain. The shared rules are tested on
them directly (``test_audit_night.py``, on ``sample_night``), and both
readers are fed them on documents the real audit wrote
(``tests/spark_audit/test_trend.py``, the report;
``tests/ledgermq/namesrv/test_audit_verdict.py``, the NameServer).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from typing import Any

DAY = 86400.0


def sample_night(started: float) -> dict[str, Any]:
    """A failed night of two groups (findings in both, so the sums are checked
    across groups), started at ``started`` and a minute long, in the schema of
    docs/audit.md."""

    def group(name: str, cut: int, findings: dict[str, int]) -> dict[str, Any]:
        return {"cut": cut, "cut_source": "admin", "new": [cut // 2 + 1, cut],
                "reverified": [[1, cut // 4]], "dropped": [],
                "verified_through": cut, "oldest_verification": started - 3 * DAY,
                "entries_audited": 3 * cut, "bytes_audited": 300 * cut,
                "violations": sum(findings.values()), "findings": findings,
                "replicas": {f"{name}-{i}": {"agree_end": cut, "lag": i, "last_index": cut + i}
                             for i in range(3)},
                "runs": [f"runs/{name}-1"]}

    groups = {"broker-a": group("broker-a", 5000, {"body_crc": 2}),
              "broker-b": group("broker-b", 800, {"body_crc": 1, "diverged_term": 1})}
    return {"format": 1, "night": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started)),
            "started": started, "finished": started + 60.5, "duration_s": 60.5,
            "valid": False, "exit": 1, "engine": "spark", "master": "local[2]",
            "entries_audited": sum(g["entries_audited"] for g in groups.values()),
            "bytes_audited": sum(g["bytes_audited"] for g in groups.values()),
            "violations": 4, "findings": {"body_crc": 3, "diverged_term": 1},
            "groups": groups}


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
        old = next(iter(d["groups"]))  # the first group; the others stay
        d["groups"] = {new if k == old else k: g for k, g in d["groups"].items()}

    return change


def _claim_pass(d: dict[str, Any]) -> None:
    d["valid"], d["exit"] = True, 0  # a failed night made to look passed


def _inflate(d: dict[str, Any]) -> None:
    d["findings"] = {k: v + 1 for k, v in d["findings"].items()} or {"body_crc": 1}
    d["violations"] = sum(d["findings"].values())


# name -> (forgery of a night document, fragment every refusal message contains)
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
