"""The CommitLog storage adapter hands the core each snapshot's membership:
decoded from the meta on disk at open, updated by `note_snapshot`, None for a
version 1 meta, and a clear error for one that does not decode. CONFIG
entries are stored and read back like any entry."""

from __future__ import annotations

import os

import pytest

from commitlog import CommitLog, CommitLogConfig, CorruptionError
from commitlog.entry import KIND_CONFIG
from commitlog.snapshot import snapshot_path, write_snapshot
from dledger.entry import Entry, EntryKind
from dledger.membership import Member, add_learner, bootstrap, encode
from dledger.runtime.storage import CommitLogStorage
from dledger.storage import SnapshotMeta

CONFIG = bootstrap({1: "127.0.0.1:7001", 2: "127.0.0.1:7002", 3: "127.0.0.1:7003"})
GROWN = add_learner(CONFIG, Member(4, "127.0.0.1:7004", 99))
SMALL = CommitLogConfig(segment_size_bytes=4096, index_file_records=8,
                        entry_size_bytes_max=4096, message_size_bytes_max=4096)


def _entries(log: CommitLog, count: int) -> list[int]:
    """`count` NOOP entries of term 1; their end positions."""
    ends = []
    for _ in range(count):
        (entry,) = log.build_entries(1, [(2, b"noop")])
        log.append([entry])
        ends.append(entry.position + entry.size)
    return ends


def test_the_newest_snapshot_on_disk_brings_its_membership(tmp_path) -> None:
    data_dir = os.fspath(tmp_path / "n1")
    with CommitLog.open(data_dir, SMALL) as log:
        ends = _entries(log, 6)
    write_snapshot(data_dir, 3, 1, ends[2], b"three", membership=encode(CONFIG))
    write_snapshot(data_dir, 5, 1, ends[4], b"five", membership=encode(GROWN))
    with CommitLog.open(data_dir, SMALL) as log:
        storage = CommitLogStorage(log)
        assert storage.snapshot() == SnapshotMeta(5, 1, ends[4], GROWN)
        assert storage.snapshot_membership == GROWN


def test_a_version_1_snapshot_has_no_membership(tmp_path) -> None:
    data_dir = os.fspath(tmp_path / "n1")
    with CommitLog.open(data_dir, SMALL) as log:
        ends = _entries(log, 3)
        write_snapshot(data_dir, 2, 1, ends[1], b"two")
        storage = CommitLogStorage(log)
        assert storage.snapshot() == SnapshotMeta(2, 1, ends[1], None)
        assert storage.snapshot_membership is None


def test_note_snapshot_replaces_an_older_one_only(tmp_path) -> None:
    data_dir = os.fspath(tmp_path / "n1")
    with CommitLog.open(data_dir, SMALL) as log:
        ends = _entries(log, 6)
        storage = CommitLogStorage(log)
        assert storage.snapshot() is None and storage.snapshot_membership is None
        newer = write_snapshot(data_dir, 5, 1, ends[4], b"five", membership=encode(GROWN))
        older = write_snapshot(data_dir, 3, 1, ends[2], b"three", membership=encode(CONFIG))
        storage.note_snapshot(newer)
        storage.note_snapshot(older)
        assert storage.snapshot() == SnapshotMeta(5, 1, ends[4], GROWN)
        assert storage.snapshot_info == newer
        assert storage.term(5) == 1


def test_a_membership_that_is_json_but_no_configuration_fails_the_open(tmp_path) -> None:
    data_dir = os.fspath(tmp_path / "n1")
    with CommitLog.open(data_dir, SMALL) as log:
        ends = _entries(log, 3)
    write_snapshot(data_dir, 2, 1, ends[1], b"two", membership=b'{"v":1,"voters":[]}')
    with CommitLog.open(data_dir, SMALL) as log:
        with pytest.raises(CorruptionError, match="membership is unusable") as caught:
            CommitLogStorage(log)
        assert os.path.join(snapshot_path(data_dir, 2), "meta") in str(caught.value)


def test_config_entries_are_stored_and_read_back(tmp_path) -> None:
    data_dir = os.fspath(tmp_path / "n1")
    with CommitLog.open(data_dir, SMALL) as log:
        storage = CommitLogStorage(log, cache_bytes=1)  # too small: reads hit the disk
        data = encode(GROWN)
        entries = [Entry(1, 1, EntryKind.NOOP, b"", 0)]
        entries.append(Entry(2, 1, EntryKind.CONFIG, data, entries[0].end_position))
        stored = storage.write(entries, commit=0)
        assert [e.kind for e in stored] == [2, KIND_CONFIG]
        assert storage.entries(1, 3, 1 << 20) == entries
        assert storage.disk_reads == 1
