"""The cross-night report and audit.prom (``spark_audit.trend``) on real audited nights.

Each state directory is made by running the real audit (in-process engine) on
copies of the recorded real run, clean or with a planted fault
(``nightly_state.py``). The page must show every night with its verdict and
ranges and link to the run reports that exist; the plots must carry the
findings' kinds; audit.prom, parsed with prometheus_client's parser, must be
the latest night's figures. Damaged and forged night files are refused with a
message naming the file and listed as unreadable, never skipped.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark_audit import nights, trend
from tests.ledgermq.base.night_forgeries import FORGERIES
from tests.spark_audit.nightly_state import (
    DAY,
    audit_night,
    build_state,
    night_id,
    unpack,
)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return unpack(tmp_path_factory.mktemp("trend") / "base")


@pytest.fixture(scope="module")
def four_nights(base, tmp_path_factory):
    """clean, body flipped on one follower, diverged term, clean."""
    state = tmp_path_factory.mktemp("four") / "state"
    docs = build_state(state, base, [None, "body_flip", "diverged_term", None])
    return state, docs


@pytest.fixture
def state_copy(four_nights, tmp_path):
    state, docs = four_nights
    shutil.copytree(state, tmp_path / "state")
    return tmp_path / "state", docs


def prom(state: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """audit.prom parsed: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families((state / "audit.prom").read_text()):
        assert family.type == "gauge", family.name
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


class _Page(HTMLParser):
    """Rows of the nights table, links and plots of index.html."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str]] = []
        self.links: list[str] = []
        self.plots: dict[str, str] = {}
        self.verdict: dict[str, str] = {}
        self._cells: list[str] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-night" in a:
            self.rows.append({"night": a["data-night"], "verdict": a["data-verdict"]})
            self._cells = []
        if tag == "a":
            self.links.append(a["href"])
        if tag == "img" and "data-plot" in a:
            self.plots[a["data-plot"]] = base64.b64decode(a["src"].split(",", 1)[1]).decode()
        if a.get("id") == "verdict":
            self.verdict = {"state": a["data-state"]}
            self._text = []

    def handle_data(self, data):
        self._text.append(data)
        if self._cells is not None:
            self.rows[-1]["text"] = self.rows[-1].get("text", "") + data

    def handle_endtag(self, tag):
        if tag == "tr":
            self._cells = None
        if tag == "div" and self.verdict and "text" not in self.verdict:
            self.verdict["text"] = "".join(self._text)


def read_page(state: Path) -> _Page:
    p = _Page()
    p.feed((state / "index.html").read_text())
    return p


def test_every_night_is_on_the_page_with_its_verdict_and_ranges(four_nights) -> None:
    state, docs = four_nights
    page = read_page(state)
    # One row per night and group, newest first.
    assert [(r["night"], r["verdict"]) for r in page.rows] == [
        (docs[3]["night"], "passed"), (docs[2]["night"], "failed"),
        (docs[1]["night"], "failed"), (docs[0]["night"], "passed")]
    text = {r["night"]: r["text"] for r in page.rows}
    assert "body_crc 1" in text[docs[1]["night"]] and "body_mismatch 1" in text[docs[1]["night"]]
    assert "divergent_entry 1" in text[docs[2]["night"]]
    assert "1..328" in text[docs[0]["night"]]  # the first night's new range
    for doc in docs[1:]:
        (a, b), = doc["groups"]["chaos"]["reverified"]
        assert f"{a}..{b}" in text[doc["night"]]
    assert page.verdict["state"] == "passed" and docs[3]["night"] in page.verdict["text"]
    # Each night's run report is linked, and exists.
    reports = [link for link in page.links if link.endswith("report.html")]
    assert len(reports) == 4
    for link in reports:
        assert (state / link).is_file() and "LedgerMQ audit" in (state / link).read_text()
    assert all((state / link).is_file() for link in page.links)


def test_the_plots_show_the_nights_and_the_kinds_found(four_nights) -> None:
    state, docs = four_nights
    plots = read_page(state).plots
    assert set(plots) == {"Findings per night, per group", "Replica agreement per group",
                          "Data audited per night", "Time taken per night"}
    for svg in plots.values():
        assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
    findings = plots["Findings per night, per group"]
    for kind in ("body_crc", "body_mismatch", "divergent_entry", "raft_index_mismatch"):
        assert kind in findings
    agreement = plots["Replica agreement per group"]
    assert all(f"{rep} agrees to" in agreement for rep in ("n1", "n2", "n3"))
    label = f"{docs[0]['night'][4:6]}-{docs[0]['night'][6:8]}"
    assert all(label in svg for svg in plots.values())


def test_audit_prom_is_the_latest_night(four_nights) -> None:
    state, docs = four_nights
    m = prom(state)
    last = docs[-1]
    assert m[("ledgermq_audit_passed", ())] == 1
    assert m[("ledgermq_audit_exit_code", ())] == 0
    assert m[("ledgermq_audit_latest_readable", ())] == 1
    assert m[("ledgermq_audit_unreadable_nights", ())] == 0
    assert m[("ledgermq_audit_last_run_timestamp_seconds", ())] == pytest.approx(last["finished"])
    assert m[("ledgermq_audit_last_success_timestamp_seconds", ())] == pytest.approx(
        last["finished"])
    assert m[("ledgermq_audit_entries_audited", ())] == last["entries_audited"] == 984
    assert m[("ledgermq_audit_bytes_audited", ())] == last["bytes_audited"] > 0
    assert m[("ledgermq_audit_duration_seconds", ())] == pytest.approx(last["duration_s"])
    assert m[("ledgermq_audit_verified_through", (("group", "chaos"),))] == 328
    assert m[("ledgermq_audit_oldest_verification_timestamp_seconds", (("group", "chaos"),))] \
        == pytest.approx(docs[0]["started"])
    assert not [k for k in m if "findings" in k[0]]  # a clean night: no kind at all


def test_a_failed_latest_night_exports_its_findings_by_kind(base, tmp_path) -> None:
    state = tmp_path / "state"
    docs = build_state(state, base, [None, "body_flip"])
    m = prom(state)
    assert m[("ledgermq_audit_passed", ())] == 0
    assert m[("ledgermq_audit_exit_code", ())] == 1
    assert m[("ledgermq_audit_findings", (("kind", "body_crc"),))] == 1
    assert m[("ledgermq_audit_findings", (("kind", "body_mismatch"),))] == 1
    assert m[("ledgermq_audit_group_findings", (("group", "chaos"), ("kind", "body_crc")))] == 1
    # The last success is the night before.
    assert m[("ledgermq_audit_last_success_timestamp_seconds", ())] == pytest.approx(
        docs[0]["finished"])
    assert m[("ledgermq_audit_last_run_timestamp_seconds", ())] == pytest.approx(
        docs[1]["finished"])
    page = read_page(state)
    assert page.verdict["state"] == "failed" and "body_crc 1" in page.verdict["text"]


def test_inputs_unreadable_is_its_own_verdict(tmp_path) -> None:
    """A night whose audit exited 2 (here: its data directory is missing)."""
    from spark_audit import cli

    state = tmp_path / "state"
    started = time.time()
    nid = night_id(started)
    rc = cli.run([str(tmp_path / "no-such-data")], out=str(state / "nights" / nid / "runs" / "x"),
                 engine="python")
    assert rc == 2
    doc = {"format": 1, "night": nid, "started": started, "finished": time.time(),
           "duration_s": 0.01, "valid": False, "exit": rc, "engine": "python",
           "master": "in-process", "entries_audited": 0, "bytes_audited": 0, "violations": 0,
           "findings": {}, "groups": {}}
    (state / "nights" / nid).mkdir(parents=True, exist_ok=True)
    for path in (state / "nights" / nid / "night.json", state / "latest.json"):
        path.write_text(json.dumps(doc))
    trend.write_outputs(str(state))
    m = prom(state)
    assert (m[("ledgermq_audit_passed", ())], m[("ledgermq_audit_exit_code", ())]) == (0, 2)
    page = read_page(state)
    assert page.rows[0]["verdict"] == "failed" and "INPUTS UNREADABLE" in page.rows[0]["text"]
    assert "no group audited" in page.rows[0]["text"]


@pytest.fixture(scope="module")
def failed_doc(four_nights):
    return four_nights[1][1]  # the body_flip night: violations to forge away


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_forged_night_is_listed_as_unreadable_naming_the_file(failed_doc, tmp_path,
                                                               name) -> None:
    """The report's reader refuses each forgery the shared rules refuse
    (tests/ledgermq/base/test_audit_night.py), on a night the real audit wrote."""
    forge, fragment = FORGERIES[name]
    path = tmp_path / "nights" / failed_doc["night"] / "night.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(forge(failed_doc))
    st = nights.read_state(tmp_path)
    (row,) = st.nights
    assert row.night is None and st.readable == []
    assert str(path) in row.error and fragment in row.error, row.error


def test_the_untouched_document_is_accepted(failed_doc, tmp_path) -> None:
    """The forgeries' base is itself believable: each refusal is the forgery's doing."""
    path = tmp_path / "nights" / failed_doc["night"] / "night.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(failed_doc))
    (tmp_path / "latest.json").write_text(json.dumps(failed_doc))
    st = nights.read_state(tmp_path)
    assert st.latest is not None and st.latest.findings == failed_doc["findings"]
    assert [r.night for r in st.nights] == [st.latest]


def test_bad_nights_are_listed_as_unreadable_not_skipped(state_copy, capsys) -> None:
    state, docs = state_copy
    forged = state / "nights" / docs[1]["night"] / "night.json"
    forged.write_bytes(FORGERIES["failed_claims_pass"][0](docs[1]))
    # A night's file copied into another night's directory.
    moved = state / "nights" / night_id(docs[0]["started"] - DAY)
    moved.mkdir()
    shutil.copy(state / "nights" / docs[0]["night"] / "night.json", moved / "night.json")
    # A night that never wrote its file, and a stray directory.
    (state / "nights" / night_id(docs[0]["started"] - 2 * DAY)).mkdir()
    (state / "nights" / "notes").mkdir()
    trend.write_outputs(str(state))
    err = capsys.readouterr().err
    page = read_page(state)
    verdicts = {r["night"]: (r["verdict"], r["text"]) for r in page.rows}
    assert len(verdicts) == 7
    bad = {n: t for n, (v, t) in verdicts.items() if v == "unreadable"}
    assert len(bad) == 4 and "4 unreadable night(s)" in (state / "index.html").read_text()
    assert "a passed night with 2 violation(s)" in bad[docs[1]["night"]]
    assert str(forged) in bad[docs[1]["night"]] and str(forged) in err
    assert "lies in" in bad[moved.name] and "missing" in bad[night_id(docs[0]["started"] - 2 * DAY)]
    assert "not a night id" in bad["notes"]
    assert prom(state)[("ledgermq_audit_unreadable_nights", ())] == 4
    # The good nights are still shown, and the latest is still believed.
    assert verdicts[docs[3]["night"]][0] == "passed"
    assert prom(state)[("ledgermq_audit_passed", ())] == 1


def _refused_latest(state: Path) -> tuple[dict, _Page]:
    trend.write_outputs(str(state))
    return prom(state), read_page(state)


def test_a_forged_latest_is_refused(state_copy) -> None:
    state, docs = state_copy
    latest = state / "latest.json"
    # An older night's document put back as the latest (hiding the newer verdict).
    latest.write_text(json.dumps(docs[2]))
    m, page = _refused_latest(state)
    assert m[("ledgermq_audit_latest_readable", ())] == 0
    assert m[("ledgermq_audit_passed", ())] == 0
    assert ("ledgermq_audit_exit_code", ()) not in m
    assert page.verdict["state"] == "unreadable"
    assert str(latest) in page.verdict["text"]
    assert f"names night {docs[2]['night']}, but {docs[3]['night']} is newer" in \
        page.verdict["text"]
    # The same refusal the page showed, for more forgeries (the reader alone).
    for forged, reason in (
            # The newest night's document, edited: no longer its night's copy.
            (json.dumps(dict(docs[3], entries_audited=1)), "of which it must be a copy"),
            (json.dumps(dict(docs[3], night="20000101T000000Z")),
             "has no readable nights/20000101T000000Z/night.json"),
            ('{"format": 1,', "malformed JSON")):
        latest.write_text(forged)
        st = nights.read_state(state)
        assert st.latest is None and st.latest_present
        assert str(latest) in st.latest_error and reason in st.latest_error


def test_no_latest_yet(state_copy) -> None:
    state, _ = state_copy
    (state / "latest.json").unlink()
    m, page = _refused_latest(state)
    assert page.verdict["state"] == "none"
    # Nothing claims a verdict; the history still says when the audit last passed.
    assert set(m) == {("ledgermq_audit_unreadable_nights", ()),
                      ("ledgermq_audit_last_success_timestamp_seconds", ())}
    assert len(page.rows) == 4


def test_an_empty_state_directory(tmp_path) -> None:
    trend.write_outputs(str(tmp_path))
    page = read_page(tmp_path)
    assert page.verdict["state"] == "none" and page.rows == [] and page.plots == {}
    assert prom(tmp_path)[("ledgermq_audit_last_success_timestamp_seconds", ())] == 0


def test_free_text_is_escaped_and_outputs_are_replaced_atomically(base, tmp_path) -> None:
    state = tmp_path / "state"
    doc = audit_night(base, state, time.time())
    doc["master"] = "<img src=x onerror=alert(1)>"
    for path in (state / "nights" / doc["night"] / "night.json", state / "latest.json"):
        path.write_text(json.dumps(doc))
    trend.write_outputs(str(state))
    trend.write_outputs(str(state))
    html = (state / "index.html").read_text()
    assert "<img src=x" not in html
    assert sorted(p.name for p in state.iterdir()) == ["audit.prom", "index.html",
                                                        "latest.json", "nights"]


def test_the_command_line(state_copy, capsys) -> None:
    state, _ = state_copy
    assert trend.main([str(state), "--max-nights", "2"]) == 0
    assert len(read_page(state).plots) == 4
    assert re.search(r"The last 2 night\(s\)", (state / "index.html").read_text())
    assert trend.main([str(state / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
