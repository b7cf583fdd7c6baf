"""What ``spark_audit.prepare`` refuses or reports before any check runs: sizes
the audit is told (``--max-entry-size``, ``--segment-size``) that no log can
have, and files whose names put them past 2^63-1.

A segment size the files contradict used to be believed: every entry past
the first rollover was then reported out of place (thousands of
`position_gap` violations about the option, not the data). Now the audit
refuses such options with exit 2 and says why, on the one-off and the
nightly command lines alike; a size that fits the files audits as before.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_audit import cli, planted
from spark_audit.audit import AuditOptions, AuditResult, run_audit
from spark_audit.engine import LocalEngine, LocalFlowEngine
from tests.chaos.histories import REAL_RUN

SEGMENT = 16384  # the recorded run's segment size


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return planted.unpack_base(REAL_RUN, tmp_path_factory.mktemp("sizes") / "base") / "data"


BAD = [
    (["--max-entry-size", "-5"], "the largest entry size (-5) must be at least"),
    (["--max-entry-size", "47"], "at least an entry header (48 bytes)"),
    (["--segment-size", "-1"], "the segment size (-1) must be 0"),
    (["--segment-size", "7"], "the segment size (7) must be 0"),
    # Not a divisor of the names 16384, 32768, 49152.
    (["--segment-size", "20000"], "00000000000000016384: it does not start at a multiple"),
    # A divisor of every name, but smaller than the files are long.
    (["--segment-size", "8192"], "which is 16"),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_sizes_no_log_can_have_are_refused(data: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           args: list[str], message: str) -> None:
    code = cli.main([str(data), "--engine", "python", "--out", str(tmp_path / "o"), *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o" / "summary.json").exists()


@pytest.mark.parametrize(("args", "message"), BAD[:4])
def test_the_nightly_audit_refuses_them_before_its_night(data: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         args: list[str], message: str) -> None:
    state = tmp_path / "state"
    code = cli.main([str(data), "--engine", "python", "--nightly", "--state", str(state), *args])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (state / "nights").exists()


def test_the_real_segment_size_audits_as_when_inferred(data: Path, tmp_path: Path) -> None:
    assert cli.main([str(data), "--engine", "python", "--out", str(tmp_path / "a")]) == 0
    assert cli.main([str(data), "--engine", "python", "--out", str(tmp_path / "b"),
                     "--segment-size", str(SEGMENT)]) == 0
    a, b = ((tmp_path / d / "summary.json").read_text() for d in "ab")
    assert a.count('"violations": 0') == b.count('"violations": 0')


def _with_strays(data: Path, tmp_path: Path,
                 paths: Callable[[Path, Path], list[Path]]) -> tuple[Path, list[Path]]:
    """A copy of `data` with 200-byte stray files at `paths(node, queue)`: one
    replica's directory and its first ConsumeQueue directory."""
    work = tmp_path / "data"
    shutil.copytree(data, work)
    node = work / planted.GROUP / "n2"
    strays = paths(node, next((node / "consumequeue").glob("*/0")))
    for stray in strays:
        stray.parent.mkdir(parents=True, exist_ok=True)
        stray.write_bytes(b"\x01" * 200)
    return work, strays


def _audits(work: Path) -> Iterator[tuple[AuditResult, dict[int, str]]]:
    """Both in-process engines' results on `work`, with each file's path by id."""
    for eng in (LocalEngine(), LocalFlowEngine()):
        res = run_audit(AuditOptions([str(work)]), eng)
        yield res, {f.fid: f.path for f in res.files}


def test_files_named_past_2_63_are_reported_and_the_rest_audited(data: Path,
                                                                 tmp_path: Path) -> None:
    """A stray file whose name puts it past 2^63-1 (it used to stop the audit with
    "Python int too large to convert to C long") is an implausible value, not read;
    everything else is audited as before, on both in-process engines."""
    work, strays = _with_strays(data, tmp_path, lambda node, queue: [
        node / "commitlog" / "99999999999999999999",
        node / "commitlog" / f"{(1 << 63) - 100:020d}",  # its bytes would pass 2^63-1
        node / "index" / "99999999999999999999",
        queue / "99999999999999999999",
        node / "snapshots" / "99999999999999999999" / "meta"])
    clean = run_audit(AuditOptions([str(data)]), LocalEngine())
    for res, files in _audits(work):
        bad = [r for r in res.findings.to_pylist() if r["severity"] == "violation"]
        assert {r["kind"] for r in bad} == {"implausible_value"}, bad
        assert sorted(files[r["fid"]] for r in bad) == sorted(map(str, strays))
        assert [g.committed for g in res.groups.values()] == [
            g.committed for g in clean.groups.values()]


def test_a_directory_set_aside_by_repair_is_not_a_replica(data: Path, tmp_path: Path) -> None:
    """`ledgermq node repair` renames a damaged directory to `<dir>.damaged-<time>`
    beside its group's replicas; a root-level audit skips it, and says so. Taken
    for a replica, a copy of n2 would be a fourth member carrying n2's identity."""
    work = tmp_path / "data"
    shutil.copytree(data, work)
    aside = work / planted.GROUP / "n2.damaged-20261206T111500Z"
    shutil.copytree(work / planted.GROUP / "n2", aside)
    for spec in (work, work / planted.GROUP):
        res = run_audit(AuditOptions([str(spec)]), LocalEngine())
        assert res.valid and [r.name for r in res.replicas] == ["n1", "n2", "n3"]
        info = [r for r in res.findings.to_pylist() if r["kind"] == "set_aside_dir"]
        assert [r["detail"].split(":")[0] for r in info] == [str(aside)]


def test_what_repair_set_aside_inside_a_mount_point_is_not_read(data: Path,
                                                               tmp_path: Path) -> None:
    """On a mount point, repair moves the damaged files into `<dir>/damaged-<time>/`
    and starts afresh beside them: those files are not the replica's."""
    work = tmp_path / "data"
    shutil.copytree(data, work)
    node = work / planted.GROUP / "n3"
    aside = node / "damaged-20261206T111500Z"
    shutil.copytree(work / planted.GROUP / "n1", aside)
    (aside / "hardstate").write_bytes(b"torn")
    res = run_audit(AuditOptions([str(work)]), LocalEngine())
    assert res.valid and not [f for f in res.files if "damaged-" in f.path]
    kinds = {r["kind"]: r for r in res.findings.to_pylist()}
    assert "unknown_file" not in kinds
    assert kinds["set_aside_dir"]["detail"].startswith(f"{aside}:")


def test_names_that_only_look_like_the_format_are_unknown_files(data: Path,
                                                               tmp_path: Path) -> None:
    """A segment name in other digits ("٣" is a digit to Python's int()) or
    with a final newline, a queue directory "٣", a "LOCK\\n": each used to
    pass a "$"-anchored pattern or str.isdigit() (read as a segment, or
    ignored as the lock); each is an unknown file now, not read, and the
    rest audits as before."""
    work, strays = _with_strays(data, tmp_path, lambda node, queue: [
        node / "commitlog" / ("0" * 19 + "\u0663"),
        node / "commitlog" / ("0" * 20 + "\n"),
        node / "index" / ("0" * 19 + "\u0661"),
        queue.parent / "\u0663" / ("0" * 20),
        node / "LOCK\n"])
    clean = run_audit(AuditOptions([str(data)]), LocalEngine())
    for res, files in _audits(work):
        unknown = [r for r in res.findings.to_pylist() if r["kind"] == "unknown_file"]
        assert sorted(files[r["fid"]] for r in unknown) == sorted(map(str, strays))
        assert res.valid == clean.valid
        assert [g.committed for g in res.groups.values()] == [
            g.committed for g in clean.groups.values()]
