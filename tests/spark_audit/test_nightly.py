"""The nightly audit (``nightly``) on a real run's replicas, the log growing by cuts.

Night by night: the new range, the rolling re-verification, the manifest, the
night's documents (night.json with every key of the schema, latest.json its
copy), the summary line and the exit status; the hook of the cross-night
outputs; options refused; one night on Spark giving the in-process night's
manifest exactly. (Real brokers, retention and a planted rewrite:
``test_nightly_cluster``.)
"""

from __future__ import annotations

import fcntl
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from ledgermq.base import audit_night
from spark_audit import cli, manifest, planted
from tests.chaos.histories import REAL_RUN

G = planted.GROUP
GROUP_KEYS = {"cut", "cut_source", "new", "reverified", "dropped", "verified_through",
              "oldest_verification", "entries_audited", "bytes_audited", "violations",
              "findings", "replicas", "runs"}
TOP_KEYS = {"format", "night", "started", "finished", "duration_s", "valid", "exit", "engine",
            "master", "entries_audited", "bytes_audited", "violations", "findings", "groups"}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return planted.unpack_base(REAL_RUN, tmp_path_factory.mktemp("nightly") / "base")


def night(base: Path, state: Path, cut: int | None = None, engine: str = "python",
          nights: int = 2, **kw: Any) -> tuple[int, dict[str, Any]]:
    code = cli.nightly([str(base / "data")], str(state), rolling_nights=nights,
                       cuts=[f"{G}={cut}"] if cut else [], engine=engine, digest_block=64,
                       progress=False, **kw)
    return code, json.loads((state / "latest.json").read_text())


def check_schema(doc: dict[str, Any], state: Path) -> None:
    assert set(doc) == TOP_KEYS and doc["format"] == 1
    assert doc["valid"] == (doc["exit"] == 0)
    assert doc["started"] <= doc["finished"] and doc["duration_s"] >= 0
    assert doc["violations"] == sum(doc["findings"].values())
    for g in doc["groups"].values():
        assert set(g) == GROUP_KEYS and g["cut_source"] in ("admin", "files")
        assert g["violations"] == sum(g["findings"].values())
        for r in g["replicas"].values():
            assert set(r) == {"agree_end", "lag", "last_index"}
        for run in g["runs"]:
            assert (state / "nights" / doc["night"] / run / "summary.json").is_file()
    own = state / "nights" / doc["night"] / "night.json"
    assert json.loads(own.read_text()) == doc  # latest.json is its copy
    # The readers' contract (ledgermq.base.audit_night) believes both files.
    assert audit_night.read_night(own, doc["night"]).doc == doc
    assert audit_night.read_latest(state).night == doc["night"]


def test_nights_over_a_growing_log(base, tmp_path, capsys) -> None:
    state = tmp_path / "state"
    code, doc = night(base, state, 100)
    g = doc["groups"][G]
    assert code == 0 and g["new"] == [1, 100] and g["reverified"] == []
    assert g["cut"] == 100 and g["cut_source"] == "admin" and g["verified_through"] == 100
    assert g["entries_audited"] == 300 and g["runs"] == ["runs/new"]
    check_schema(doc, state)
    line = capsys.readouterr().out.strip()
    assert line == (f"audit night {doc['night']} PASSED: 1 group, 300 entries (new 1..100) "
                    f"in {doc['duration_s']:.1f} s")

    code, doc = night(base, state, 200)
    g = doc["groups"][G]
    # Half of the 100 verified indexes at least (N = 2), the stalest spans first.
    assert code == 0 and g["new"] == [101, 200]
    assert g["reverified"] == [[1, 63]] and g["runs"] == ["runs/new", "runs/reverify-1"]
    check_schema(doc, state)

    code, doc = night(base, state)  # no cut: up to the files' committed index
    g = doc["groups"][G]
    assert code == 0 and g["new"] == [201, 328] and g["cut"] == 328
    # Due: 64..100 (verified on night 1); then the stalest of night 2 up to 100 indexes.
    assert g["cut_source"] == "files" and g["reverified"] == [[1, 100]]
    m = manifest.load(str(state), G)
    assert m is not None and m.nights == 3 and m.verified_through == 328
    assert [(s.lo, s.hi) for s in m.spans][:4] == [(1, 63), (64, 100), (101, 127),
                                                   (128, 191)]
    assert all(set(s.replicas) == {"n1", "n2", "n3"} for s in m.spans)
    assert min(s.night_no for s in m.spans) == 2  # every span verified within 2 nights

    # Nothing new: the sample is still re-verified.
    code, doc = night(base, state)
    g = doc["groups"][G]
    assert code == 0 and g["new"] is None and g["reverified"] == [[1, 200]]
    assert g["oldest_verification"] == min(s.verified for s in manifest.load(
        str(state), G).spans)  # type: ignore[union-attr]
    assert len(os.listdir(state / "nights")) == 4
    capsys.readouterr()


def test_the_cross_night_outputs_are_written_by_trend(base, tmp_path, monkeypatch,
                                                      capsys) -> None:
    calls: list[tuple[str, bool]] = []
    fake = types.ModuleType("spark_audit.trend")
    fake.__spec__ = importlib.machinery.ModuleSpec("spark_audit.trend", None)

    def write_outputs(state_dir: str) -> None:
        calls.append((state_dir, (Path(state_dir) / "latest.json").exists()))

    fake.write_outputs = write_outputs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "spark_audit.trend", fake)
    state = tmp_path / "state"
    code, _ = night(base, state, 50)
    assert code == 0 and calls == [(str(state), True)]

    def broken(state_dir: str) -> None:
        raise RuntimeError("disk full")

    fake.write_outputs = broken  # type: ignore[attr-defined]
    code, doc = night(base, state, 60)
    assert code == 2 and doc["exit"] == 0  # the night passed; its outputs did not
    assert "index.html, audit.prom) failed: RuntimeError('disk full')" in capsys.readouterr().err

    monkeypatch.delitem(sys.modules, "spark_audit.trend")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "spark_audit.trend" else real(name, *a))
    code, _ = night(base, state, 70)
    assert code == 0 and "spark_audit.trend is not installed" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--nightly"], "--nightly needs --state"),
    (["--state", "S"], "--nightly needs --state"),
    (["--nightly", "--state", "S", "--from", f"{G}=5"], "chooses its own windows"),
    (["--nightly", "--state", "S", "--rolling-nights", "0"], "at least 1"),
    (["--nightly", "--state", "S", "--digest-block", "100"], "power of two"),
    (["--nightly", "--state", "S", "--cut", "other=5"], "not among chaos"),
    (["--nightly", "--state", "S", "--cut", f"{G}=999"], "above what the files"),
])
def test_bad_nightly_options_exit_2(base, tmp_path, capsys, argv, message) -> None:
    argv = [a.replace("S", str(tmp_path / "state")) for a in argv]
    assert cli.main([str(base / "data"), "--engine", "python", *argv]) == 2
    got = capsys.readouterr()
    assert message in got.out + got.err


def test_a_night_that_cannot_run_changes_nothing(base, tmp_path, capsys) -> None:
    state = tmp_path / "state"
    assert night(base, state, 100)[0] == 0
    before = manifest.load(str(state), G)
    code, doc = night(base, state, 999)  # above what the files hold
    assert code == 2 and doc["exit"] == 2 and doc["groups"][G]["violations"] == 0
    assert manifest.load(str(state), G) == before
    assert "ERROR: --cut chaos=999 is above what the files" in capsys.readouterr().out
    # A second nightly audit of the same state waits for none: it is refused.
    fd = os.open(state / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert cli.nightly([str(base / "data")], str(state), engine="python") == 2
        assert "another nightly audit holds" in capsys.readouterr().out
    finally:
        os.close(fd)


@pytest.mark.spark
def test_keyed_manifests_through_the_command_line(base, tmp_path, capsys) -> None:
    """``--manifest-key-file``: nights with the key pass and seal with it; a night
    without it, or with another key, cannot believe the manifest (exit 2, nothing
    changed); a key file others may read is refused."""
    state = tmp_path / "state"
    key, other = tmp_path / "key", tmp_path / "other"
    key.write_text("k" * 32)
    other.write_text("o" * 32)
    key.chmod(0o600)
    other.chmod(0o600)
    base_argv = [str(base / "data"), "--engine", "python", "--nightly", "--state", str(state),
                 "--no-progress"]
    assert cli.main([*base_argv, "--cut", f"{G}=100", "--manifest-key-file", str(key)]) == 0
    assert cli.main([*base_argv, "--manifest-key-file", str(key)]) == 0
    sealed = (state / "manifest" / f"{G}.json").read_text()
    assert '"hmac_sha256"' in sealed
    capsys.readouterr()
    for argv in ([], ["--manifest-key-file", str(other)]):
        assert cli.main([*base_argv, *argv]) == 2
        out = capsys.readouterr().out
        assert "manifest" in out and ("sealed with a manifest key" in out
                                      or "does not match its hmac_sha256" in out), out
    assert (state / "manifest" / f"{G}.json").read_text() == sealed
    other.chmod(0o644)
    assert cli.main([*base_argv, "--manifest-key-file", str(other)]) == 2
    assert "chmod 600" in capsys.readouterr().out


def test_a_night_on_spark_gives_the_in_process_manifest(base, tmp_path, spark) -> None:
    """Night 1 in-process; night 2 (new range and re-verification) on Spark and in-process
    from copies of that state: the same night and the same manifest."""
    first = tmp_path / "first"
    assert night(base, first, 150)[0] == 0
    runs = {}
    for engine in ("python", "spark"):
        state = tmp_path / engine
        shutil.copytree(first, state)
        code, doc = night(base, state, engine=engine, master="local[2]")
        assert code == 0 and doc["engine"] == engine
        runs[engine] = (doc, manifest.load(str(state), G))
    (a, ma), (b, mb) = runs["python"], runs["spark"]
    assert ma is not None and mb is not None
    assert [(s.lo, s.hi, s.replicas) for s in ma.spans] == [
        (s.lo, s.hi, s.replicas) for s in mb.spans]
    keep = ("new", "reverified", "dropped", "verified_through", "entries_audited",
            "bytes_audited", "findings", "replicas", "runs")
    assert {k: a["groups"][G][k] for k in keep} == {k: b["groups"][G][k] for k in keep}
    assert a["groups"][G]["reverified"] and b["master"] == "local[2]"


def test_the_manifest_keeps_the_deletions_later_windows_need(tmp_path, capsys) -> None:
    """Night 1 reads a ``topic.delete`` at 31; night 2 re-verifies 1..23, below it, where
    every replica dropped the topic's queues: the manifest tells the window."""
    from . import scenarios
    from .test_topic_deletion import DELETE_AT, _write

    data = tmp_path / "data"
    _write(str(data / "g"), {key: {"orders": DELETE_AT} for key in scenarios.NODES})
    state = tmp_path / "state"

    def one(cut: int | None = None) -> tuple[int, dict[str, Any]]:
        code = cli.nightly([str(data)], str(state), rolling_nights=2, engine="python",
                           cuts=[f"g={cut}"] if cut else [], digest_block=8)
        return code, json.loads((state / "latest.json").read_text())["groups"]["g"]

    code, g = one(40)
    m = manifest.load(str(state), "g")
    assert code == 0 and m is not None
    assert [(d.index, d.topic) for d in m.deletions] == [(DELETE_AT, "orders")]
    # Without Raft-index files a window cannot read the deletions past its cut
    # itself (window.ReplicaLog.deletions_past): only the manifest tells it.
    for path in data.glob("g/*/index/*"):
        path.unlink()
    code, g = one()
    assert code == 0 and g["reverified"] == [[1, 23]], capsys.readouterr().out
    # Without it, the same night finds the dead messages unindexed.
    manifest.save(str(state), m.model_copy(update={"deletions": []}))
    code, g = one()
    assert code == 1 and "cq_not_indexed" in g["findings"]
    capsys.readouterr()
