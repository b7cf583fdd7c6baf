"""A file listed and gone when read (a live broker's retention, a replaced
snapshot) makes the audit list again, not fail; other failures are exit 2 in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

from spark_audit import runs
from spark_audit.audit import AuditOptions
from spark_audit.engine import LocalEngine
from spark_audit.inputs import FileInfo

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
