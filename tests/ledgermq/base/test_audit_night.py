"""The shared contract of night.json and latest.json (``ledgermq.base.audit_night``).

Both readers (the report's ``spark_audit.nights``, the NameServer's
``ledgermq.namesrv.audit_verdict``) believe a night only through this module;
their own tests feed them the same forgeries on documents the real audit
wrote. Here the rules are tested directly on ``sample_night``: every forgery
is refused naming the file and the reason, the untouched document is
accepted field by field, and latest.json is believed only as the newest
finished night's own file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from ledgermq.base import audit_night
from ledgermq.base.audit_night import NightError, night_file, read_latest, read_night
from tests.ledgermq.base.night_forgeries import DAY, FORGERIES, sample_night

NOW = time.time()


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return path


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_every_forgery_is_refused_naming_the_file(tmp_path, name) -> None:
    forge, fragment = FORGERIES[name]
    path = tmp_path / "night.json"
    path.write_bytes(forge(sample_night(NOW - DAY)))
    with pytest.raises(NightError) as err:
        read_night(path)
    assert str(path) in str(err.value) and fragment in str(err.value), str(err.value)


def test_the_untouched_document_is_believed(tmp_path) -> None:
    """The forgeries' base is itself believable: each refusal is the forgery's doing."""
    doc = sample_night(NOW - DAY)
    night = read_night(write(night_file(tmp_path, doc["night"]), doc), doc["night"])
    assert night.doc == doc and not night.passed and night.violations == 4
    assert night.findings == {"body_crc": 3, "diverged_term": 1}
    a, b = night.groups["broker-a"], night.groups["broker-b"]
    assert (a.new, a.reverified, a.new_indexes, a.reverified_indexes) == (
        (2501, 5000), [(1, 1250)], 2500, 1250)
    assert b.replicas["broker-b-2"] == audit_night.Replica(agree_end=800, lag=2, last_index=802)
    assert b.findings == {"body_crc": 1, "diverged_term": 1} and b.runs == ["runs/broker-b-1"]


def test_a_night_must_lie_in_its_own_directory(tmp_path) -> None:
    doc = sample_night(NOW - DAY)
    path = write(tmp_path / "nights" / "20000101T000000Z" / "night.json", doc)
    with pytest.raises(NightError, match="lies in '20000101T000000Z'"):
        read_night(path, "20000101T000000Z")


def test_an_oversized_file_is_refused_unread(tmp_path) -> None:
    path = tmp_path / "night.json"
    path.write_bytes(json.dumps(sample_night(NOW)).encode() + b" " * audit_night.MAX_FILE_BYTES)
    with pytest.raises(NightError, match="more than a night file may hold"):
        read_night(path)


def test_the_future_is_measured_with_some_slack(tmp_path) -> None:
    """An auditing host's clock a little ahead is tolerated, an hour and more is not."""
    doc = sample_night(NOW)
    path = write(tmp_path / "night.json", doc)
    finished = doc["finished"]
    slack = audit_night.FUTURE_SLACK_S
    assert read_night(path, now=finished - slack + 1).finished == finished
    with pytest.raises(NightError, match=r"finished: .* is in the future"):
        read_night(path, now=finished - slack - 1)


def test_zero_counts_need_not_be_listed_by_every_group(tmp_path) -> None:
    doc = sample_night(NOW)
    doc["findings"]["replica_lag"] = 0  # a kind seen with no violation tonight
    assert read_night(write(tmp_path / "night.json", doc)).findings["replica_lag"] == 0


# ------------------------------------------------------------------ latest.json


@pytest.fixture
def state(tmp_path) -> tuple[Path, list[dict[str, Any]]]:
    """Three nights a day apart, the newest copied as latest.json, and a stray directory."""
    docs = [sample_night(NOW - (3 - i) * DAY) for i in range(3)]
    for doc in docs:
        write(night_file(tmp_path, doc["night"]), doc)
    write(tmp_path / "latest.json", docs[-1])
    (tmp_path / "nights" / "notes").mkdir()
    return tmp_path, docs


def test_latest_is_the_newest_nights_own_file(state) -> None:
    root, docs = state
    assert audit_night.night_ids(root) == [d["night"] for d in docs]
    assert read_latest(root).doc == docs[-1]
    # A newer night still running (no night.json yet), or one whose file cannot be
    # believed, does not make latest.json out of date.
    running = sample_night(NOW)["night"]
    (root / "nights" / running).mkdir()
    assert read_latest(root).night == docs[-1]["night"]
    night_file(root, running).write_text('{"format": 1,')
    assert read_latest(root).night == docs[-1]["night"]
    # Once it has finished, latest.json still naming the older one is refused.
    write(night_file(root, running), sample_night(NOW))
    with pytest.raises(NightError, match=f"names night {docs[-1]['night']}, but {running} "
                                         "is newer"):
        read_latest(root)


@pytest.mark.parametrize("forge, reason", [
    (lambda docs: docs[0], "is newer"),  # an older night's file put back
    (lambda docs: dict(docs[-1], entries_audited=1), "of which it must be a copy"),
    (lambda docs: sample_night(NOW - 10 * DAY), "has no readable nights/"),
])
def test_a_latest_that_is_not_the_newest_nights_copy_is_refused(state, forge, reason) -> None:
    root, docs = state
    latest = write(root / "latest.json", forge(docs))
    with pytest.raises(NightError) as err:
        read_latest(root)
    assert str(latest) in str(err.value) and reason in str(err.value), str(err.value)


def test_latest_is_judged_against_the_callers_reading_of_the_nights(state) -> None:
    root, docs = state
    asked: list[str] = []

    def own(night_id: str) -> audit_night.Night:
        asked.append(night_id)
        raise NightError(f"{night_id}: refused by the caller")

    with pytest.raises(NightError, match=r"has no readable .*refused by the caller"):
        read_latest(root, own)
    assert asked == [docs[-1]["night"]]
    assert audit_night.night_ids(root / "nowhere") == []
