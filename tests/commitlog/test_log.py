"""CommitLog behaviour through its public API: appends, reads, truncation,
retention, recovery and bad input."""

from __future__ import annotations

import itertools
import os

import pytest
from storage_support import SMALL, fill, message_body

from commitlog import (
    KIND_CONTROL,
    KIND_MESSAGES,
    KIND_NOOP,
    CommitLog,
    CommitLogConfig,
    ConfigError,
    CorruptionError,
    Entry,
    HardState,
    LockedError,
    MessageTooLargeError,
    PositionMismatchError,
    decode_messages,
)


def test_append_read_and_reopen_across_segments(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 40)
        assert log.last_index == 40
        assert len(log.segments.bases) > 3  # rolled over several times
        entries = log.read_entries(1, 41)
        assert [e.index for e in entries] == list(range(1, 41))
        for before, after in itertools.pairwise(entries):
            assert after.position in (before.end, log.segments.base_of(before.end) + 4096)
    with CommitLog.open(data_dir, SMALL) as log:
        assert log.recovery.cuts == []
        assert log.read_entries(1, 41) == entries
        assert log.term_at(40) == 1 and log.term_at(0) == 0


def test_read_entries_respects_max_bytes_but_returns_at_least_one(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 10)
        assert len(log.read_entries(1, 11, max_bytes=1)) == 1
        assert 1 < len(log.read_entries(1, 11, max_bytes=1500)) < 10


def test_messages_are_readable_by_physical_offset(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        log.append(log.build_entries(1, [(KIND_MESSAGES, message_body(5))]))
        entry = log.read_entry(1)
        for stored in decode_messages(entry.body, entry.position):
            again = log.read_message(stored.physical_offset, stored.size)
            assert again == stored
        with pytest.raises(CorruptionError):
            log.read_message(entry.position + 1, 50)


def test_appends_that_do_not_continue_the_log_are_refused(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 3, term=2)
        with pytest.raises(PositionMismatchError, match="does not follow"):
            log.append([Entry(5, 2, KIND_NOOP, log.end, b"")])
        with pytest.raises(PositionMismatchError, match="term"):
            log.append([Entry(4, 1, KIND_NOOP, log.end, b"")])
        with pytest.raises(PositionMismatchError, match="placement says"):
            log.append([Entry(4, 2, KIND_NOOP, log.end + 8, b"")])
        with pytest.raises(MessageTooLargeError, match="entry of"):
            log.append(log.build_entries(2, [(KIND_CONTROL, b"x" * 5000)]))
        assert log.last_index == 3
        assert [e.index for e in log.read_entries(1, 4)] == [1, 2, 3]


def test_a_failed_batch_leaves_nothing_behind(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 2)
        good = log.build_entries(1, [(KIND_MESSAGES, message_body(1))])[0]
        bad = Entry(good.index + 1, 1, KIND_NOOP, good.end + 1, b"")
        with pytest.raises(PositionMismatchError):
            log.append([good, bad])
        assert log.last_index == 2


def test_truncate_after_then_append_new_term(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 30)
        log.flush()
        log.checkpoint()
        kept = log.read_entries(1, 13)
        log.truncate_after(12)
        assert (log.last_index, log.end) == (12, kept[-1].end)
        fill(log, 5, term=3)
        assert log.term_at(17) == 3
    with CommitLog.open(data_dir, SMALL) as log:
        assert log.recovery.cuts == []
        assert log.read_entries(1, 13) == kept
        assert log.last_index == 17


def test_truncate_everything(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 5)
        log.truncate_after(0)
        assert (log.last_index, log.end, log.last_term) == (0, 0, 0)
        fill(log, 2, term=4)
    with CommitLog.open(data_dir, SMALL) as log:
        assert [e.term for e in log.read_entries(1, 3)] == [4, 4]


def test_retention_deletes_whole_segments_only(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 40)
        log.flush()
        cut = log.segments.bases[3] + 10
        removed = log.delete_before(cut)
        assert removed == 3
        assert log.segments.bases[0] == 3 * 4096
        first = log.first_index
        assert log.read_entry(first).position == 3 * 4096
        with pytest.raises(IndexError):
            log.read_entry(first - 1)
    with CommitLog.open(data_dir, SMALL) as log:
        assert log.first_index == first and log.last_index == 40


def test_torn_tail_is_cut_and_reported(data_dir: str) -> None:
    log = CommitLog.open(data_dir, SMALL)
    fill(log, 10)
    log.flush()
    log.checkpoint()
    fill(log, 3)  # not checkpointed
    last_base = log.segments.bases[-1]
    path = log.segments.path(last_base)
    end = log.end
    log.abandon()
    with open(path, "r+b") as handle:
        handle.truncate(end - last_base - 7)
    with CommitLog.open(data_dir, SMALL) as log:
        assert log.last_index == 12
        (cut,) = log.recovery.cuts
        assert cut.path == path and "runs past the file end" in cut.reason
        assert any("cut torn tail" in line for line in log.recovery.lines())


def test_flipped_byte_after_the_checkpoint_cuts_from_that_entry(data_dir: str) -> None:
    log = CommitLog.open(data_dir, SMALL)
    fill(log, 4)
    log.flush()
    log.checkpoint()
    fill(log, 4)
    victim = log.read_entry(6)
    log.abandon()
    path = os.path.join(data_dir, "commitlog", f"{victim.position // 4096 * 4096:020d}")
    with open(path, "r+b") as handle:
        handle.seek(victim.position % 4096 + 60)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 1]))
    with CommitLog.open(data_dir, SMALL) as log:
        assert log.last_index == 5
        assert log.recovery.cuts[0].reason == "body CRC mismatch"
        assert log.recovery.cuts[0].offset == victim.position % 4096


def test_corruption_before_the_checkpoint_stops_startup(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 12)
        victim = log.read_entry(log.last_index - 1)
    path = os.path.join(data_dir, "commitlog", f"{victim.position // 4096 * 4096:020d}")
    size_before = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.seek(victim.position % 4096 + 50)
        handle.write(b"\xff\xff")
    with pytest.raises(CorruptionError, match="body CRC mismatch") as error:
        CommitLog.open(data_dir, SMALL)
    assert error.value.path == path
    assert error.value.offset == victim.position % 4096
    assert os.path.getsize(path) == size_before  # nothing was deleted


def test_corruption_in_an_old_segment_is_caught_on_read(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 40)
        victim = log.read_entry(2)
    path = os.path.join(data_dir, "commitlog", f"{0:020d}")
    with open(path, "r+b") as handle:
        handle.seek(victim.position + 70)
        handle.write(b"\x00\x01\x02")
    # Tail verification on open does not look that far back; the read does.
    with CommitLog.open(data_dir, SMALL) as log, pytest.raises(CorruptionError, match="CRC"):
        log.read_entries(1, 41)
    full = CommitLogConfig(**{**SMALL.__dict__, "verify_on_open": "full"})
    with pytest.raises(CorruptionError):
        CommitLog.open(data_dir, full)


def test_missing_index_files_are_rebuilt(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 30)
        entries = log.read_entries(1, 31)
    for name in os.listdir(os.path.join(data_dir, "index")):
        os.remove(os.path.join(data_dir, "index", name))
    with CommitLog.open(data_dir, SMALL) as log:
        assert log.recovery.index_rebuilt_from is not None
        assert log.read_entries(1, 31) == entries


def test_damaged_index_record_is_reported_on_read(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 30)
    path = os.path.join(data_dir, "index", f"{1:020d}")
    with open(path, "r+b") as handle:
        handle.seek(32 * 2 + 3)
        handle.write(b"\x99")
    with CommitLog.open(data_dir, SMALL) as log, pytest.raises(CorruptionError, match="index"):
        log.read_entry(3)


def test_foreign_files_are_reported_not_deleted(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 3)
    # Names that str.isdigit() or a "$"-anchored pattern would take for a
    # segment: "²" (int() refuses it), "٣" (int() reads 3), a final newline.
    strays = [os.path.join(data_dir, "notes.txt"), os.path.join(data_dir, "commitlog", "x.log"),
              os.path.join(data_dir, "commitlog", "0" * 19 + "\u00b2"),
              os.path.join(data_dir, "commitlog", "0" * 19 + "\u0663"),
              os.path.join(data_dir, "commitlog", "0" * 20 + "\n")]
    for stray in strays:
        with open(stray, "w") as handle:
            handle.write("mine")
    with CommitLog.open(data_dir, SMALL) as log:
        assert sorted(log.recovery.foreign_files) == sorted(strays)
        assert log.last_index == 3
    assert all(os.path.exists(p) for p in strays)


def test_a_second_process_cannot_open_the_same_directory(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL), pytest.raises(LockedError, match="in use"):
        CommitLog.open(data_dir, SMALL)


def test_segment_size_change_is_refused(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 20)
    bigger = CommitLogConfig(segment_size_bytes=8192, index_file_records=8)
    with pytest.raises(ConfigError, match="segment size must not change"):
        CommitLog.open(data_dir, bigger)


def test_unknown_checkpoint_version_is_refused(data_dir: str) -> None:
    import struct

    import crc32c

    from commitlog import FormatVersionError
    from commitlog.checkpoint import CHECKPOINT_MAGIC
    with CommitLog.open(data_dir, SMALL) as log:
        fill(log, 2)
    head = struct.pack("<IIQQQQI", CHECKPOINT_MAGIC, 9, 0, 0, 0, 1, 0)
    with open(os.path.join(data_dir, "checkpoint"), "wb") as handle:
        handle.write(head + struct.pack("<I", crc32c.crc32c(head)))
    with pytest.raises(FormatVersionError, match="unsupported format version 9"):
        CommitLog.open(data_dir, SMALL)


def test_hard_state_round_trip(data_dir: str) -> None:
    with CommitLog.open(data_dir, SMALL) as log:
        assert log.load_hard_state() == HardState()
        log.save_hard_state(HardState(term=5, vote=2, commit=17))
    with CommitLog.open(data_dir, SMALL) as log:
        assert log.load_hard_state() == HardState(5, 2, 17)
