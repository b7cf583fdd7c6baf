"""A file listed and gone when read (a live broker's retention, a replaced
snapshot), or cut shorter than listed (a follower replacing a stale tail),
makes the audit list again, not fail; other failures are exit 2 in one line."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from spark_audit import runs, tasks, window
from spark_audit.audit import AuditOptions
from spark_audit.engine import LocalEngine
from spark_audit.inputs import LOCAL, FileInfo, View

from . import scenarios
from .replica_builder import write_snapshot


class ReplacingBroker(LocalEngine):
    """The in-process engine, with a broker replacing n1's snapshot right after
    the audit listed the files (before it reads them), once per directory given."""

    def __init__(self, snapshot_dirs: list[str]) -> None:
        super().__init__()
        self.pending = list(snapshot_dirs)
        self.reads = 0

    def read_small(self, files: list[FileInfo]) -> dict[int, bytes]:
        self.reads += 1
        if self.pending:
            shutil.rmtree(self.pending.pop(0))
        return super().read_small(files)


def _group_with_snapshots(root: Path, count: int) -> list[str]:
    lay = scenarios.clean(str(root / "g1"))
    n1 = lay["n1"]
    dirs = []
    for i in range(count):
        entry = n1.entry(40 + i)
        dirs.append(write_snapshot(n1.root, entry.index, 1, entry.position + entry.size,
                                   b"state %d" % i))
    return dirs


def test_a_snapshot_replaced_between_listing_and_reading_is_listed_again(tmp_path: Path):
    dirs = _group_with_snapshots(tmp_path, 1)
    eng = ReplacingBroker(dirs)
    res = runs.audit_listing_again(AuditOptions([str(tmp_path / "g1")], []), eng)
    assert res.valid, res.findings.to_pylist()
    assert eng.reads == 2  # the first run met the vanished file; the second did not
    assert not any("snapshots" in f.path for f in res.files)


def test_files_vanishing_on_every_listing_end_in_exit_2_in_one_line(tmp_path: Path):
    dirs = _group_with_snapshots(tmp_path, runs.VANISHED_RETRIES + 1)
    eng = ReplacingBroker(dirs)
    opts = AuditOptions([str(tmp_path / "g1")], [])
    try:
        runs.audit_listing_again(opts, eng)
    except FileNotFoundError as exc:
        assert "snapshots" in str(exc)
    else:
        raise AssertionError("the audit ran although every listing met a vanished file")
    assert eng.reads == runs.VANISHED_RETRIES + 1


def test_a_spark_executor_error_is_one_line() -> None:
    text = ("An exception was thrown from the Python worker. Please see the stack trace below.\n"
            "Traceback (most recent call last):\n"
            '  File "/x/tasks.py", line 12, in run\n'
            "    raise OSError(5, 'Input/output error')\n"
            "OSError: [Errno 5] Input/output error: '/data/n1/commitlog/000'\n")
    assert runs.one_line(RuntimeError(text)) == \
        "OSError: [Errno 5] Input/output error: '/data/n1/commitlog/000'"
    assert runs.one_line(ValueError("bad --cut")) == "bad --cut"
    assert runs.vanished(RuntimeError("FileNotFoundError: [Errno 2] No such file"))
    assert not runs.vanished(RuntimeError(text))


class CuttingBroker(LocalEngine):
    """The in-process engine, with n1's last segment cut to a quarter of its length right
    after the listing (below the cut: a lagging follower truncating a stale tail)
    and written back once the first run is over (the leader's entries replicated)."""

    def __init__(self, segment: str) -> None:
        super().__init__()
        self.segment, self.cut, self.short_reads = segment, False, 0

    def run_tasks(self, todo: list[tasks.FileTask], max_entry_size: int
                  ) -> list[tasks.FileResult]:
        if self.cut:
            return super().run_tasks(todo, max_entry_size)
        self.cut = True
        original = Path(self.segment).read_bytes()
        os.truncate(self.segment, len(original) // 4)
        try:
            return super().run_tasks(todo, max_entry_size)
        except tasks.FileChangedError:
            self.short_reads += 1
            raise
        finally:
            Path(self.segment).write_bytes(original)


def _cut_audit(root: Path) -> tuple[AuditOptions, str]:
    lay = scenarios.clean(str(root / "g1"))
    n1 = lay["n1"]
    segment = n1.segment_path(n1.entries[-1].segment)
    cut = n1.entries[-1].index - 5
    bounds = window.bounds_from_options([f"g1={cut}"], [])
    return AuditOptions([str(root / "g1")], [], bounds=bounds), segment


def test_a_segment_cut_below_the_view_after_listing_is_listed_again(tmp_path: Path):
    opts, segment = _cut_audit(tmp_path)
    eng = CuttingBroker(segment)
    res = runs.audit_listing_again(opts, eng)
    assert res.valid, res.findings.to_pylist()
    assert eng.short_reads == 1  # the first run read short; the second read it whole


def test_a_short_read_is_an_error_not_a_crash(tmp_path: Path):
    # Memory-mapped, the same cut would have killed the process with SIGBUS.
    opts, segment = _cut_audit(tmp_path)
    with pytest.raises(tasks.FileChangedError, match="when listed"):
        runs.audit_listing_again(opts, CuttingBroker(segment), retries=0)


def test_read_file_reads_exactly_the_view(tmp_path: Path):
    path = tmp_path / "f"
    data = bytes(range(256)) * 64
    path.write_bytes(data)
    whole = FileInfo(1, 1, 1, str(path), "segment", len(data))
    assert bytes(tasks.read_file(whole)) == data
    part = FileInfo(1, 1, 1, str(path), "segment", 1000, view=View(3000, 4000))
    buf = tasks.read_file(part)
    assert len(buf) == 4000 and bytes(buf[3000:4000]) == data[3000:4000]
    assert bytes(buf[:3000]) == bytes(3000)  # never read
    to_end = FileInfo(1, 1, 1, str(path), "segment", len(data) - 3000, view=View(3000))
    assert bytes(tasks.read_file(to_end)[3000:]) == data[3000:]  # end -1: the listed length
    past = FileInfo(1, 1, 1, str(path), "segment", 100, view=View(len(data), len(data) + 100))
    with pytest.raises(tasks.FileChangedError):
        tasks.read_file(past)


def test_a_file_gone_while_its_directory_is_listed_leaves_the_rest_listed(tmp_path: Path):
    # A live broker renames temporary files into place (its hard state, a
    # checkpoint): one gone between the directory's read and its stat used
    # to make the whole directory list as empty, and a scheduled night then
    # refused the replica as "missing or empty".
    (tmp_path / "commitlog").mkdir()
    stop = threading.Event()

    def broker() -> None:
        n = 0
        while not stop.is_set():
            temporary = tmp_path / f"hardstate.{n % 64}.tmp"
            temporary.write_bytes(b"x")
            temporary.rename(tmp_path / "hardstate")
            n += 1

    writer = threading.Thread(target=broker)
    writer.start()
    try:
        for _ in range(3000):
            listed = {name for name, _, _ in LOCAL.children(str(tmp_path))}
            assert "commitlog" in listed
    finally:
        stop.set()
        writer.join()
