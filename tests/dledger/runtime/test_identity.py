"""The data directory's identity (dledger/runtime/identity.py) on real files:
created once, adopted for old directories, checked at every open, never
regenerated when damaged; `repair` sets a directory aside whole."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from support import small_tmpfs

from commitlog import CommitLog, CommitLogConfig, HardState
from commitlog.errors import LockedError
from dledger.runtime.identity import (
    FORMAT_VERSION,
    IDENTITY_FILE,
    DataDirIdentity,
    ForeignDataDirError,
    IdentityCorruptError,
    IdentityError,
    UnsupportedFormatError,
    check_format,
    holds_data,
    new_directory_id,
    open_identity,
    read_identity,
    repair,
    write_identity,
)
from dledger.runtime.node import NodeConfig

CLUSTER = "DefaultCluster/g"


def _with_version(raw: bytes, version: int) -> bytes:
    """The file's bytes with another format version, CRC made good again."""
    body = raw[:4] + struct.pack("<I", version) + raw[8:-4]
    return body + struct.pack("<I", crc32c(body))


def test_a_new_directory_gets_an_identity_that_later_opens_return(tmp_path: Path) -> None:
    d = str(tmp_path / "n1")
    opened = open_identity(d, CLUSTER, 1)
    assert opened.how == "created"
    ident = opened.identity
    assert (ident.cluster_id, ident.node_id, ident.format_version) == (CLUSTER, 1, FORMAT_VERSION)
    assert 0 < ident.directory_id < 1 << 63 and ident.created_ms > 0
    again = open_identity(d, CLUSTER, 1)
    assert again.how == "existing" and again.identity == ident
    assert read_identity(d) == ident
    # No temporary file is left behind, and the CommitLog knows the file.
    assert sorted(os.listdir(d)) == ["IDENTITY", "LOCK"]
    with CommitLog.open(d, CommitLogConfig(segment_size_bytes=1 << 20)) as log:
        assert log.recovery.foreign_files == []


def test_a_wiped_directory_gets_a_new_directory_id(tmp_path: Path) -> None:
    d = tmp_path / "n1"
    first = open_identity(str(d), CLUSTER, 1).identity
    for name in os.listdir(d):
        os.remove(d / name)
    second = open_identity(str(d), CLUSTER, 1)
    assert second.how == "created"
    assert second.identity.directory_id != first.directory_id
    assert len({new_directory_id() for _ in range(1000)}) == 1000


def test_a_directory_from_before_identities_is_adopted(tmp_path: Path) -> None:
    d = str(tmp_path / "n1")
    with CommitLog.open(d, CommitLogConfig(segment_size_bytes=1 << 20)) as log:
        log.save_hard_state(HardState(term=3, vote=2, commit=0))
    assert holds_data(d) and read_identity(d) is None
    opened = open_identity(d, CLUSTER, 2)
    assert opened.how == "adopted"
    assert opened.identity.format_version == 1 and opened.identity.node_id == 2
    with CommitLog.open(d, CommitLogConfig(segment_size_bytes=1 << 20)) as log:
        assert log.load_hard_state() == HardState(term=3, vote=2, commit=0)  # untouched
    assert open_identity(d, CLUSTER, 2).how == "existing"


def test_another_cluster_or_node_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    d = str(tmp_path / "n1")
    open_identity(d, CLUSTER, 1)
    before = (Path(d) / IDENTITY_FILE).read_bytes()
    with pytest.raises(ForeignDataDirError, match="belongs to cluster 'DefaultCluster/g', "
                       "not to 'DefaultCluster/h'"):
        open_identity(d, "DefaultCluster/h", 1)
    with pytest.raises(ForeignDataDirError, match=r"belongs to node 1 .* not to node 3"):
        open_identity(d, CLUSTER, 3)
    assert (Path(d) / IDENTITY_FILE).read_bytes() == before


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "short", "magic"])
def test_a_damaged_identity_is_refused_never_regenerated(tmp_path: Path, damage: str) -> None:
    d = str(tmp_path / "n1")
    open_identity(d, CLUSTER, 1)
    path = Path(d) / IDENTITY_FILE
    raw = path.read_bytes()
    damaged = {
        "truncated": raw[:-7],
        "flipped": raw[:20] + bytes([raw[20] ^ 0x10]) + raw[21:],
        "empty": b"",
        "short": raw[:6],
        "magic": b"XXXX" + raw[4:-4] + struct.pack("<I", crc32c(b"XXXX" + raw[4:-4])),
    }[damage]
    path.write_bytes(damaged)
    with pytest.raises(IdentityCorruptError, match=r"is damaged .*never regenerated.*node repair"):
        open_identity(d, CLUSTER, 1)
    assert path.read_bytes() == damaged


def test_a_format_version_this_build_does_not_read_is_refused(tmp_path: Path) -> None:
    d = str(tmp_path / "n1")
    open_identity(d, CLUSTER, 1)
    path = Path(d) / IDENTITY_FILE
    path.write_bytes(_with_version(path.read_bytes(), FORMAT_VERSION + 1))
    with pytest.raises(UnsupportedFormatError) as newer:
        open_identity(d, CLUSTER, 1)
    text = str(newer.value)
    assert f"format version {FORMAT_VERSION + 1}, newer than" in text
    assert f"supports (version {FORMAT_VERSION})" in text and "release that reads" in text
    # Older and no longer supported: the message says how to get there.
    with pytest.raises(UnsupportedFormatError, match=r"version 1, older than this build "
                       r"supports \(versions 2 to 3\).*node repair"):
        check_format("x/IDENTITY", 1, 2, 3)
    check_format("x/IDENTITY", 2, 2, 3)


def test_a_directory_in_use_cannot_be_opened_or_repaired(tmp_path: Path) -> None:
    d = str(tmp_path / "n1")
    open_identity(d, CLUSTER, 1)
    with CommitLog.open(d, CommitLogConfig(segment_size_bytes=1 << 20)):
        with pytest.raises(LockedError):
            open_identity(d, CLUSTER, 1)
        with pytest.raises(LockedError):
            repair(d)
    assert not list(tmp_path.glob("n1.damaged-*"))


def test_repair_sets_the_directory_aside_whole_and_starts_afresh(tmp_path: Path) -> None:
    d = tmp_path / "n2"
    old = open_identity(str(d), CLUSTER, 2).identity
    with CommitLog.open(str(d), CommitLogConfig(segment_size_bytes=1 << 20)) as log:
        log.save_hard_state(HardState(term=5, vote=1, commit=0))
    (d / "snapshots").mkdir()
    (d / "snapshots" / "note").write_text("keep me")
    files_before = sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    done = repair(str(d))
    assert done.previous == old and done.previous_problem == ""
    assert done.aside is not None and Path(done.aside).parent == tmp_path
    assert Path(done.aside).name.startswith("n2.damaged-") and done.aside.endswith("Z")
    aside = Path(done.aside)
    assert sorted(str(p.relative_to(aside)) for p in aside.rglob("*")) == files_before
    assert (aside / "snapshots" / "note").read_text() == "keep me"
    assert read_identity(str(aside)) == old
    # The fresh directory: only the new identity, same cluster and node, new id.
    assert sorted(os.listdir(d)) == [IDENTITY_FILE]
    new = read_identity(str(d))
    assert new == done.identity and new is not None
    assert (new.cluster_id, new.node_id) == (CLUSTER, 2)
    assert new.directory_id != old.directory_id
    assert not holds_data(str(d))
    assert open_identity(str(d), CLUSTER, 2).how == "existing"
    # A second repair in the same second gets its own name.
    again = repair(str(d))
    assert again.aside is not None and again.aside != done.aside
    assert read_identity(again.aside) == new


def test_repair_of_a_damaged_identity_needs_the_node_named(tmp_path: Path) -> None:
    d = tmp_path / "n3"
    open_identity(str(d), CLUSTER, 3)
    (d / IDENTITY_FILE).write_bytes(b"garbage")
    with pytest.raises(IdentityError, match="give the node's cluster id and node id"):
        repair(str(d))
    assert (d / IDENTITY_FILE).read_bytes() == b"garbage"  # nothing moved
    done = repair(str(d), CLUSTER, 3)
    assert done.previous is None and "damaged" in done.previous_problem
    assert done.aside is not None
    assert (Path(done.aside) / IDENTITY_FILE).read_bytes() == b"garbage"
    assert open_identity(str(d), CLUSTER, 3).identity == done.identity


def test_repair_through_a_symbolic_link_keeps_the_link_working(tmp_path: Path) -> None:
    (tmp_path / "disk2").mkdir()
    target = tmp_path / "disk2" / "n1"
    old = open_identity(str(target), CLUSTER, 1).identity
    link = tmp_path / "n1"
    link.symlink_to(target)
    done = repair(str(link))
    assert done.aside is not None and Path(done.aside).parent == tmp_path / "disk2"
    assert read_identity(done.aside) == old
    assert link.is_symlink() and read_identity(str(link)) == done.identity


def test_repair_of_a_missing_directory_creates_it(tmp_path: Path) -> None:
    done = repair(str(tmp_path / "gone"), CLUSTER, 4)
    assert done.aside is None and done.previous is None
    assert read_identity(str(tmp_path / "gone")) == done.identity


def test_repair_of_a_mount_point_moves_its_content_into_it(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "mnt", "4m") as mount:
        old = open_identity(str(mount), CLUSTER, 1).identity
        (mount / "hardstate").write_bytes(b"h")
        done = repair(str(mount))
        assert done.aside is not None and Path(done.aside).parent == mount
        assert Path(done.aside).name.startswith("damaged-")
        assert sorted(os.listdir(done.aside)) == ["IDENTITY", "LOCK", "hardstate"]
        assert read_identity(done.aside) == old
        assert read_identity(str(mount)) == done.identity
        assert not holds_data(str(mount))
        # The CommitLog does not report the set-aside directory as foreign.
        with CommitLog.open(str(mount), CommitLogConfig(segment_size_bytes=1 << 20)) as log:
            assert log.recovery.foreign_files == []


def test_identity_fields_are_checked() -> None:
    with pytest.raises(ValueError):
        DataDirIdentity(CLUSTER, 1, 0)
    with pytest.raises(ValueError):
        DataDirIdentity("", 1, 5)
    with pytest.raises(ValueError):
        DataDirIdentity("a\nb", 1, 5)
    with pytest.raises(ValueError):
        DataDirIdentity("x" * 256, 1, 5)
    with pytest.raises(ValueError):
        NodeConfig(group="g", node_id=1, peers={1: ("127.0.0.1", 1)}, data_dir="d",
                   directory_id=1 << 63)
    assert NodeConfig(group="g", node_id=1, peers={1: ("127.0.0.1", 1)}, data_dir="d",
                      directory_id=(1 << 63) - 1).directory_id == (1 << 63) - 1


def test_write_and_read_round_trip(tmp_path: Path) -> None:
    ident = DataDirIdentity("cluster é/g", 7, 12345, FORMAT_VERSION, 99)
    write_identity(str(tmp_path), ident)
    assert read_identity(str(tmp_path)) == ident
