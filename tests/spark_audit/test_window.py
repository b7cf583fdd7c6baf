"""The cut and the window (``window``) on a real run's three replicas.

``--cut GROUP=HI``: bytes past entry HI and ConsumeQueue units pointing past
it are neither read nor judged, however damaged (a live broker's torn tail,
half-written segment or unit). ``--from GROUP=LO``: what lies below LO counts
as verified before, and segments wholly below it are not read. Inside the
window a fault is found exactly as the whole audit finds it. Both engines
(in-process, and the distributed map and reduce calls run in this process)
find the same rows and compute the same span digests; the digest of a span
does not depend on the window it was read through.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledgermq.cli import app
from spark_audit import cli, digest, fmt, planted, window
from spark_audit.audit import AuditOptions, AuditResult, run_audit
from spark_audit.engine import LocalEngine, LocalFlowEngine
from spark_audit.runs import audit_to
from tests.chaos.histories import REAL_RUN

G = planted.GROUP
KEY = ["check", "kind", "severity", "rid", "fid", "file_offset", "index", "topic",
       "queue_id", "slot", "phys_offset", "count", "detail"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return planted.unpack_base(REAL_RUN, tmp_path_factory.mktemp("window") / "base")


def copy(base: Path, dest: Path) -> Path:
    shutil.copytree(base / "data", dest)
    return dest


def both(data: Path, bounds: dict[str, window.Bounds] | None = None,
         plans: dict[str, digest.Plan] | None = None) -> AuditResult:
    """The audit on both engines; they must find the same rows and digests."""
    opts = AuditOptions([str(data)], bounds=bounds or {}, digests=plans or {})
    a, b = run_audit(opts, LocalEngine()), run_audit(opts, LocalFlowEngine())
    rows = [sorted(r.findings.select(KEY).to_pylist(), key=repr) for r in (a, b)]
    assert rows[0] == rows[1]
    assert a.digests == b.digests
    st_a, st_b = a.groups[0], b.groups[0]
    assert (st_a.committed, st_a.sources) == (st_b.committed, st_b.sources)
    return a


def violations(res: AuditResult) -> set[tuple[str, int, str]]:
    names = {(r.gid, r.rid): r.name for r in res.replicas}
    files = {f.fid: f.path for f in res.files}
    return {(r["kind"], r["index"], f"{names.get((r['gid'], r['rid']), '')}:"
             f"{Path(files.get(r['fid'], '')).name}@{r['file_offset']}")
            for r in res.findings.to_pylist() if r["severity"] == "violation"}


def test_nothing_past_the_cut_is_read_or_judged(base, tmp_path) -> None:
    data = copy(base, tmp_path / "data")
    g = data / G
    cut = 200  # in the middle of the third segment
    after = planted.entry(g / "n2", cut + 1)
    planted.write_at(after.path, after.off + 10, b"\xff" * 40)  # a damaged entry past it
    last = sorted((g / "n1" / "commitlog").iterdir())[-1]
    with open(last, "ab") as fh:  # a torn tail
        fh.write(b"\x4c\x4d\x51\x45partial")
    segs = sorted((g / "n3" / "commitlog").iterdir())
    nxt = int(segs[-1].name) + 16384
    (g / "n3" / "commitlog" / f"{nxt:020d}").write_bytes(b"\x00" * 30)  # half-written
    cq = planted.cq_file(g / "n1", 0)
    n = cq.stat().st_size // 20
    slot, (off, size, tag) = n - 1, planted.unit(cq, n - 1)
    assert off > planted.entry(g / "n1", cut).position  # a unit past the cut
    planted.set_unit(cq, slot, off + 1, size, tag)  # pointing nowhere
    with open(cq, "ab") as fh:
        fh.write(b"\x01" * 7)  # a unit being written

    full = both(data)
    assert not full.valid and {"torn_tail", "cq_dangling", "header_crc"} <= {
        k for k, _, _ in violations(full)} | {
        r["kind"] for r in full.findings.to_pylist()}
    res = both(data, {G: window.Bounds(1, cut)})
    assert res.valid, violations(res)
    kinds = {r["kind"] for r in res.findings.to_pylist()}
    assert kinds <= {"cq_same_as_reference", "cq_beyond_commit", "no_identity"}, kinds
    st = res.groups[0]
    assert st.committed == st.claimed_commit == cut
    assert [m.last_index for m in st.replicas.values()] == [cut] * 3
    end = planted.entry(g / "n1", cut)
    for f in res.files:  # no segment byte past the end of entry 200
        if f.kind == "segment":
            assert f.start < end.position + end.size
            assert f.start + f.read_from + f.length <= end.position + end.size
        elif f.kind == "cq":  # nor a unit pointing past it
            assert f.view is not None
            raw = Path(f.path).read_bytes()
            for k in range(f.view.start // 20, f.view.end // 20):
                assert fmt.CQ_UNIT.unpack_from(raw, k * 20)[0] < end.position + end.size
            assert len(raw) < 20 * (f.view.end // 20 + 1) or fmt.CQ_UNIT.unpack_from(
                raw, f.view.end)[0] >= end.position + end.size
    assert res.counts["bytes"] < full.counts["bytes"]


def test_below_the_window_nothing_is_read_inside_it_faults_are_found(base, tmp_path) -> None:
    data = copy(base, tmp_path / "data")
    g = data / G
    lo = 150
    low = planted.mid_messages(g / "n2", 20)  # in the first segment, wholly below 150
    at, n = planted.first_record_body(low)
    planted.flip(low.path, at + n // 2)
    res = both(data, {G: window.Bounds(lo, 0)})
    assert res.valid, violations(res)
    assert all(f.kind != "segment" or f.start >= 16384 for f in res.files)
    at = planted.entry(g / "n1", lo).position
    for f in (f for f in res.files if f.kind == "cq"):  # units below it are not read
        assert f.view is not None and f.view.start > 0
        raw = Path(f.path).read_bytes()
        k = f.view.start // 20
        assert fmt.CQ_UNIT.unpack_from(raw, (k - 1) * 20)[0] < at
        assert fmt.CQ_UNIT.unpack_from(raw, k * 20)[0] >= at
    st = res.groups[0]
    assert st.committed == 328 and st.first_index == lo
    assert all(m.first_index == lo and m.trimmed for m in st.replicas.values())

    # A fault inside the window: the rows the whole audit reports for it, no more.
    inside = planted.mid_messages(g / "n3", 250)
    at, n = planted.first_record_body(inside)
    planted.flip(inside.path, at + n // 2)
    whole = {v for v in violations(both(data)) if v[1] != low.index and
             not v[2].startswith("n2:00000000000000000000")}
    assert violations(both(data, {G: window.Bounds(lo, 0)})) == whole
    assert ("body_crc", inside.index, f"n3:{inside.path.name}@{inside.off}") in whole


def test_an_entry_missing_at_the_windows_start_is_a_gap(base, tmp_path) -> None:
    data = copy(base, tmp_path / "data")
    n2 = data / G / "n2"
    e = planted.entry(n2, 150)
    planted.rewrite(e, index=151)  # 150 gone, 151 twice: the window starts at 151 on n2
    res = both(data, {G: window.Bounds(150, 0)})
    got = violations(res)
    assert ("index_gap", 151, f"n2:{e.path.name}@{e.off}") in got


def test_without_index_files_the_window_is_found_by_walking(base, tmp_path) -> None:
    with_index = both(copy(base, tmp_path / "a"), {G: window.Bounds(120, 250)})
    data = copy(base, tmp_path / "b")
    for node in (data / G).iterdir():
        shutil.rmtree(node / "index")
    walked = both(data, {G: window.Bounds(120, 250)})
    assert walked.valid

    def views(res: AuditResult) -> list[tuple[str, object]]:
        return sorted((Path(f.path).relative_to(Path(f.path).parents[3]).as_posix(), f.view)
                      for f in res.files if f.kind in ("segment", "cq"))

    assert views(walked) == views(with_index)


def test_a_span_has_one_digest_whatever_the_window(base, tmp_path) -> None:
    data = copy(base, tmp_path / "data")
    spans = ((130, 191), (192, 200))
    plans = {G: digest.Plan(spans=spans)}
    full = both(data, None, plans).digests[0]
    assert both(data, {G: window.Bounds(130, 200)}, plans).digests[0] == full
    assert both(data, {G: window.Bounds(100, 260)}, plans).digests[0] == full
    assert {d for per in full.values() for d in per.values()} == {
        (62, full[spans[0]][0][1]), (9, full[spans[1]][0][1])}
    # An open plan digests from its start to the claimed commit, cut at blocks.
    opened = both(data, {G: window.Bounds(100, 0)},
                  {G: digest.Plan(open_from=101, block=64)}).digests[0]
    assert sorted(opened) == [(101, 127), (128, 191), (192, 255), (256, 319), (320, 328)]
    assert opened[(128, 191)] == both(data, None, {G: digest.Plan(
        spans=((128, 191),))}).digests[0][(128, 191)]
    # A rewrite with every CRC recomputed changes the digest of its span only.
    e = planted.entry(data / G / "n1", 150)
    planted.rewrite(e, body=planted.rewritten_body(e) if e.kind == fmt.KIND_MESSAGES
                    else planted.body_of(e)[::-1])
    after = both(data, None, plans).digests[0]
    assert after[spans[0]][0] != full[spans[0]][0]
    assert after[spans[0]][1] == full[spans[0]][1] and after[spans[1]] == full[spans[1]]


@pytest.mark.parametrize(("args", "message"), [
    (["--cut", f"{G}=999"], "above what the files of group chaos hold: their highest "
                            "Raft index is 328"),
    (["--cut", "nope=5"], "not among the groups audited (chaos)"),
    (["--cut", f"{G}=abc"], "is not a Raft index"),
    (["--cut", f"{G}=0"], "must be in 1..2^63-1"),
    (["--cut", f"{G}={1 << 63}"], "must be in 1..2^63-1"),
    (["--cut", "5"], "expected GROUP=INDEX"),
    (["--cut", f"{G}=5", "--cut", f"{G}=6"], "twice"),
    (["--cut", f"{G}=50", "--from", f"{G}=60"], "--from 60 is above --cut 50"),
    (["--cut", f"{G}=50", "--history", "HISTORY"], "needs the whole log"),
])
def test_bad_bounds_are_refused(base, tmp_path, capsys, args, message) -> None:
    args = [a.replace("HISTORY", str(base / "history.jsonl")) for a in args]
    code = cli.main([str(base / "data"), "--engine", "python", "--out", str(tmp_path / "o"),
                     *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_cut_on_both_command_lines(base, tmp_path) -> None:
    result = CliRunner().invoke(app, ["audit", "--engine", "python", "--out",
                                      str(tmp_path / "a"), "--cut", f"{G}=250", "--from",
                                      f"{G}=100", str(base / "data")])
    assert result.exit_code == 0, result.output
    assert f"group {G}: committed 250, shared 100..250" in result.output
    assert cli.main([str(base / "data"), "--engine", "python", "--out", str(tmp_path / "b"),
                     "--cut", f"{G}=250", "--from", f"{G}=100"]) == 0
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert a["groups"] == b["groups"] and a["groups"][0]["committed_index"] == 250
    assert a["groups"][0]["window"] == {"from": 100, "cut": 250}


def test_an_unknown_engine_is_refused_on_both_command_lines(base, tmp_path, capsys) -> None:
    """`ledgermq audit --engine nosuch` used to run the Spark engine."""
    result = CliRunner().invoke(app, ["audit", "--engine", "nosuch", "--out",
                                      str(tmp_path / "a"), str(base / "data")])
    assert result.exit_code == 2 and "'nosuch' is not spark or python" in result.output
    assert not (tmp_path / "a").exists()
    with pytest.raises(SystemExit):  # argparse's choices
        cli.main([str(base / "data"), "--engine", "nosuch", "--out", str(tmp_path / "b")])
    assert "invalid choice: 'nosuch'" in capsys.readouterr().err
    outcome = audit_to(AuditOptions([str(base / "data")]), str(tmp_path / "c"), engine="nosuch")
    assert outcome.exit == 2 and "unknown engine 'nosuch'" in outcome.error


def test_index_records_name_the_window(base, tmp_path) -> None:
    """The driver's reads: the Raft-index record of an index, confirmed by its header."""
    node = base / "data" / G / "n1"
    eng = LocalEngine()
    from spark_audit import inputs

    reps = inputs.parse_group_specs([str(base / "data")])
    files = [f for f in inputs.inventory(reps) if f.rid == 0]
    log = window.ReplicaLog(eng, files, fmt.DEFAULT_MAX_ENTRY_SIZE)
    for index in (1, 93, 94, 200, 328):
        e = planted.entry(node, index)
        assert log.seek(index) == (index, e.position, e.size)
        assert log._by_walk(index) == (index, e.position, e.size)
    seg0 = next(f for f in files if f.kind == "segment" and f.start == 0)
    assert log.seek(329) is None and log.first() == (1, 0, seg0.fid)
    # A record that lies (CRC valid, position wrong) is not believed: the walk decides.
    ix = sorted((node / "index").iterdir())[0]
    work = tmp_path / "n1"
    shutil.copytree(node, work)
    ix = work / "index" / ix.name
    raw = bytearray(planted.read_at(ix, 199 * 32, 28))
    raw[0:8] = struct.pack("<Q", planted.entry(node, 150).position)
    planted.write_at(ix, 199 * 32, bytes(raw) + struct.pack("<I", fmt.crc(bytes(raw))))
    reps = inputs.parse_group_specs([f"{G}={work}"])
    log = window.ReplicaLog(eng, inputs.inventory(reps), fmt.DEFAULT_MAX_ENTRY_SIZE)
    e = planted.entry(node, 200)
    assert log._by_record(200) is None and log.seek(200) == (200, e.position, e.size)
