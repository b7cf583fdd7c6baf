"""The NameServer's view of the nightly audit: /api/v1/audit, the audit gauges on
/metrics, and the reader behind both (ledgermq/namesrv/audit_verdict.py).

State directories are made by the real audit on copies of the recorded real
run (tests/spark_audit/nightly_state.py), with spark_audit.trend writing
index.html and audit.prom as the nightly runner does. The reader must refuse
every forgery the shared rules (ledgermq.base.audit_night) refuse; the
NameServer's gauges must be audit.prom's, name for name and value for value;
and a real `ledgermq namesrv` process must answer 404 without a verdict, the
verdict with one, and a corrupt or ambiguous state as `unreadable` with the
reason, never a 500.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from typing import Any

import pytest
from namesrv_harness import launch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ledgermq.namesrv import audit_verdict
from ledgermq.namesrv.metrics import AuditCollector
from tests.ledgermq.base.night_forgeries import FORGERIES
from tests.spark_audit.nightly_state import DAY, build_state, unpack

HOUR = 3600.0


@pytest.fixture(scope="module")
def two_nights(tmp_path_factory):
    """A clean night, then one with a body flipped on a follower (the latest)."""
    base = unpack(tmp_path_factory.mktemp("verdict") / "base")
    state = tmp_path_factory.mktemp("two") / "state"
    return state, build_state(state, base, [None, "body_flip"])


@pytest.fixture
def reports(two_nights, tmp_path):
    """A reports directory holding a copy of the state as its `audit` subdirectory."""
    root = tmp_path / "reports"
    shutil.copytree(two_nights[0], root / "audit")
    return root


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def helps(text: str) -> dict[str, tuple[str, str]]:
    return {f.name: (f.type, f.documentation) for f in text_string_to_metric_families(text)}


# ------------------------------------------------------------------ the reader


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_the_namesrv_refuses_what_the_audit_refuses(two_nights, tmp_path, name) -> None:
    """Each forgery the shared rules refuse (tests/ledgermq/base/test_audit_night.py),
    as the latest.json of a real night, is the verdict ``unreadable`` with the reason."""
    forge, fragment = FORGERIES[name]
    path = tmp_path / "latest.json"
    path.write_bytes(forge(two_nights[1][1]))
    v = audit_verdict.read_verdict(str(tmp_path))
    assert (v.state, v.night, v.age_s) == ("unreadable", None, None)
    assert str(path) in v.problem and fragment in v.problem, v.problem


def test_the_states(two_nights, reports, tmp_path) -> None:
    docs = two_nights[1]
    v = audit_verdict.read_verdict(str(reports))
    assert (v.state, v.directory, v.report) == ("failed", "audit", "audit/index.html")
    assert v.night == docs[1] and v.problem is None
    assert v.last_success == pytest.approx(docs[0]["finished"])  # the night before
    answer = v.to_json()
    assert answer["latest"] == "audit/latest.json" and answer["verdict"]["exit"] == 1
    # The state directory may also be the reports directory itself.
    direct = audit_verdict.read_verdict(str(reports / "audit"))
    assert (direct.directory, direct.report, direct.state) == ("", "index.html", "failed")
    # A passed night: fresh, then stale once older than the configured age.
    clean = tmp_path / "clean"
    shutil.copytree(reports / "audit", clean)
    (clean / "latest.json").unlink()
    shutil.rmtree(clean / "nights" / docs[1]["night"])
    shutil.copy(clean / "nights" / docs[0]["night"] / "night.json", clean / "latest.json")
    finished = docs[0]["finished"]
    fresh = audit_verdict.read_verdict(str(clean), 36 * HOUR, now=finished + 35 * HOUR)
    assert (fresh.state, fresh.last_success) == ("passed", finished)
    assert fresh.age_s == pytest.approx(35 * HOUR)
    stale = audit_verdict.read_verdict(str(clean), 36 * HOUR, now=finished + 37 * HOUR)
    assert stale.state == "stale" and stale.to_json()["stale"] is True
    # A failed night stays failed however old.
    old = audit_verdict.read_verdict(str(reports), 36 * HOUR, now=docs[1]["finished"] + 9 * DAY)
    assert old.state == "failed"


def test_no_verdict_and_unbelievable_ones(reports, tmp_path) -> None:
    with pytest.raises(audit_verdict.NoAudit, match="no reports directory"):
        audit_verdict.read_verdict("")
    (tmp_path / "empty").mkdir()
    with pytest.raises(audit_verdict.NoAudit, match="neither"):
        audit_verdict.read_verdict(str(tmp_path / "empty"))
    latest = reports / "audit" / "latest.json"
    good = latest.read_bytes()
    latest.write_bytes(good[: len(good) // 2])
    v = audit_verdict.read_verdict(str(reports))
    assert v.state == "unreadable" and v.night is None
    assert str(latest) in v.problem and "malformed JSON" in v.problem
    assert v.last_success is not None  # the clean night is still on record
    latest.write_bytes(good)
    shutil.copytree(reports / "audit", reports / "audit-old")
    v = audit_verdict.read_verdict(str(reports))
    assert v.state == "unreadable" and "several audit state directories" in v.problem
    assert "audit, audit-old" in v.problem


def test_the_namesrv_gauges_are_audit_prom(two_nights) -> None:
    """Same names, types, help and values as the audit's own audit.prom (which
    alone counts unreadable nights: the NameServer does not read every night)."""
    state, _ = two_nights
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AuditCollector(str(state)))
    ours = generate_latest(registry).decode()
    theirs = (state / "audit.prom").read_text()
    theirs_help = helps(theirs)
    theirs_help.pop("ledgermq_audit_unreadable_nights")
    assert helps(ours) == theirs_help
    expected = samples(theirs)
    expected.pop(("ledgermq_audit_unreadable_nights", ()))
    assert samples(ours) == pytest.approx(expected)
    assert samples(ours)[("ledgermq_audit_findings", (("kind", "body_crc"),))] == 1


# ------------------------------------------------------------------ the process


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read().decode()
            status = resp.status
            ctype = resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        body, status, ctype = exc.read().decode(), exc.code, exc.headers.get("Content-Type", "")
    return status, json.loads(body) if "json" in ctype else body


def audit_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = get(f"{url}/metrics")
    assert status == 200
    return {k: v for k, v in samples(text).items() if k[0].startswith("ledgermq_audit_")}


def test_the_endpoint_and_metrics_of_a_running_namesrv(two_nights, tmp_path) -> None:
    state, docs = two_nights
    root = tmp_path / "reports"
    root.mkdir()
    ns = launch(extra_args=("--admin-listen", "127.0.0.1:0", "--reports-dir", str(root),
                            "--audit-stale-hours", "48"))
    try:
        url = next(line.split()[-1] for line in ns.output
                   if "namesrv admin listening on" in line)
        status, body = get(f"{url}/api/v1/audit")
        assert (status, body["error"]["code"]) == (404, "NO_AUDIT"), body
        assert "latest.json" in body["error"]["message"]
        assert audit_samples(url) == {}
        # The nightly runner's state appears under the reports directory.
        shutil.copytree(state, root / "audit")
        status, body = get(f"{url}/api/v1/audit")
        assert status == 200, body
        assert (body["state"], body["stale_after_s"], body["report"]) == (
            "failed", 48 * HOUR, "audit/index.html")
        assert body["verdict"] == docs[1]
        assert body["last_success"] == pytest.approx(docs[0]["finished"])
        status, page = get(f"{url}/reports/{body['report']}")
        assert status == 200 and "LedgerMQ nightly audit" in page
        m = audit_samples(url)
        expected = samples((state / "audit.prom").read_text())
        expected.pop(("ledgermq_audit_unreadable_nights", ()))
        assert m == pytest.approx(expected)
        # A corrupt latest.json: an answer that says so, and gauges that do not pass.
        (root / "audit" / "latest.json").write_text('{"format": 1, "night": ')
        status, body = get(f"{url}/api/v1/audit")
        assert (status, body["state"], body["verdict"]) == (200, "unreadable", None)
        assert "latest.json" in body["problem"] and "malformed JSON" in body["problem"]
        m = audit_samples(url)
        assert m[("ledgermq_audit_latest_readable", ())] == 0
        assert m[("ledgermq_audit_passed", ())] == 0
        assert ("ledgermq_audit_exit_code", ()) not in m
        # Two state directories: which one is meant is not guessed.
        shutil.copy(state / "latest.json", root / "audit" / "latest.json")
        shutil.copytree(state, root / "audit-copy")
        status, body = get(f"{url}/api/v1/audit")
        assert (status, body["state"]) == (200, "unreadable")
        assert "several audit state directories" in body["problem"]
        status, listing = get(f"{url}/api/v1/reports")
        assert {(r["name"], r["kind"], r["path"]) for r in listing["reports"]} == {
            ("audit", "audit", "audit/index.html"),
            ("audit-copy", "audit", "audit-copy/index.html")}
        assert ns.child.alive
        assert not [line for line in ns.output if "Traceback" in line]
    finally:
        ns.stop()
