"""Snapshot transfer: a sender and a receiver over real files, through the real codec.

The channel between them is simulated here (loss, duplication, a fake
clock) so every path of the flow control runs deterministically; the
end-to-end transfer between running nodes is in test_snapshot_install.py.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from crc32c import crc32c

from commitlog.file_queue import file_name
from dledger.messages import InstallSnapshot, Message
from dledger.runtime.codec import CodecError, decode_batch, encode_message
from dledger.runtime.snapshot_transfer import (
    CHUNK_BYTES_MAX,
    STAGING_DIR,
    SnapshotAck,
    SnapshotChunk,
    SnapshotOffer,
    SnapshotReceiver,
    SnapshotSender,
    SourceUnavailable,
    open_sources,
)

SEG = 4096


class Leader:
    """A leader's files: a state file and segments 0..n-1 of the SEG grid."""

    def __init__(self, root: Path, segments: int, last_len: int, seed: int = 1) -> None:
        rng = random.Random(seed)
        self.state = rng.randbytes(3000)
        self.state_path = root / "snap-state"
        self.state_path.write_bytes(self.state)
        self.segdir = root / "commitlog"
        self.segdir.mkdir()
        self.bases = []
        self.content: dict[int, bytes] = {}
        for k in range(segments):
            base = k * SEG
            data = rng.randbytes(SEG - rng.randrange(0, 50) if k < segments - 1 else last_len)
            (self.segdir / file_name(base)).write_bytes(data)
            self.bases.append(base)
            self.content[base] = data
        self.end = self.bases[-1] + last_len - 10  # the snapshot ends inside the last one

    def sender(self, transfer: int = 7, now: float = 0.0, **knobs: float) -> SnapshotSender:
        sources = open_sources(str(self.state_path), str(self.segdir), self.bases, SEG, self.end)
        return SnapshotSender(1, 2, 5, transfer, 100, 4, self.end, 1, crc32c(self.state),
                              sources, now, chunk_bytes=1000, window_bytes=3000, **knobs)


def wire(messages: list[Message]) -> list[Message]:
    """Through the real codec, as the transport carries them."""
    return [m for msg in messages for m in decode_batch(encode_message(msg), 1 << 22)]


def run(sender: SnapshotSender, receiver: SnapshotReceiver, rng: random.Random | None = None,
        loss: float = 0.0, dup: float = 0.0, max_steps: int = 10_000) -> float:
    """Drive both ends until the sender is done or failed; returns the fake time."""
    now = 0.0
    to_follower: list[Message] = [sender.start()]
    for _ in range(max_steps):
        if sender.done or sender.failed:
            return now
        to_leader: list[SnapshotAck] = []
        for msg in wire(to_follower):
            if rng is not None and rng.random() < loss:
                continue
            copies = 2 if rng is not None and rng.random() < dup else 1
            for _ in range(copies):
                if isinstance(msg, SnapshotOffer):
                    to_leader.append(receiver.on_offer(msg))
                else:
                    assert isinstance(msg, SnapshotChunk)
                    ack = receiver.on_chunk(msg)
                    if ack is not None:
                        to_leader.append(ack)
        to_follower = []
        for ack in wire(list(to_leader)):
            if rng is not None and rng.random() < loss:
                continue
            assert isinstance(ack, SnapshotAck)
            to_follower += sender.on_ack(ack, now)
        now += 0.05
        to_follower += sender.poll(now)
    raise AssertionError("transfer did not finish")


def check_staged(leader: Leader, receiver: SnapshotReceiver, root: Path) -> None:
    staged = receiver.staged(100, 4, leader.end)
    assert staged is not None
    assert Path(staged.state_path).read_bytes() == leader.state
    assert staged.first_index == 1 and staged.state_bytes == len(leader.state)
    names = sorted(os.listdir(staged.commitlog_dir))
    assert names == [file_name(b) for b in leader.bases]
    for base in leader.bases:
        want = leader.content[base][: leader.end - base]
        assert (Path(staged.commitlog_dir) / file_name(base)).read_bytes() == want
    assert staged.segments[-1] == (leader.bases[-1], leader.end - leader.bases[-1])
    assert Path(staged.commitlog_dir).parent == root / "f" / STAGING_DIR


def receiver_at(root: Path, max_bytes: int = 1 << 30) -> SnapshotReceiver:
    return SnapshotReceiver(str(root / "f"), SEG, max_bytes, free=lambda _: None)


def test_a_clean_transfer_stages_byte_identical_files(tmp_path: Path) -> None:
    leader = Leader(tmp_path, segments=5, last_len=2000)
    sender, receiver = leader.sender(), receiver_at(tmp_path)
    run(sender, receiver)
    assert sender.done and sender.failed is None
    assert sender.bytes_sent == sender.total and sender.resends == 0
    check_staged(leader, receiver, tmp_path)
    # The window bounded what was in flight; every chunk was at most 1000 bytes.
    assert receiver.bytes_received == sender.total
    sender.close()


@pytest.mark.parametrize("seed", range(6))
def test_loss_and_duplication_are_survived_by_going_back(tmp_path: Path, seed: int) -> None:
    leader = Leader(tmp_path, segments=4, last_len=3000, seed=seed)
    sender, receiver = leader.sender(), receiver_at(tmp_path)
    run(sender, receiver, random.Random(seed), loss=0.15, dup=0.1)
    assert sender.done, sender.failed
    assert sender.resends > 0
    check_staged(leader, receiver, tmp_path)


def test_a_retried_transfer_resumes_where_the_follower_stopped(tmp_path: Path) -> None:
    leader = Leader(tmp_path, segments=5, last_len=2000)
    receiver = receiver_at(tmp_path)
    first = leader.sender(transfer=1)
    # Half the stream, then the leader goes away.
    assert isinstance(receiver.on_offer(first.start()), SnapshotAck)
    out = first.on_ack(SnapshotAck(2, 1, 5, 1, 100, 0, True), 0.0)
    for _ in range(8):
        msg = out.pop(0)
        assert isinstance(msg, SnapshotChunk)
        ack = receiver.on_chunk(msg)
        assert ack is not None
        out += first.on_ack(ack, 0.0)
    staged_before = first.acked
    assert 0 < staged_before < first.total
    first.close()
    # Another leader (another transfer id) offers the same files.
    second = leader.sender(transfer=99)
    run(second, receiver)
    assert second.done and second.resumed_from == staged_before
    assert second.bytes_sent == second.total - staged_before
    check_staged(leader, receiver, tmp_path)


def test_a_silent_follower_stalls_the_transfer(tmp_path: Path) -> None:
    leader = Leader(tmp_path, segments=2, last_len=500)
    sender = leader.sender(stall_s=3.0, retransmit_s=1.0)
    sender.start()
    assert sender.poll(0.5) == []
    assert sender.poll(1.5) == [sender.offer]  # the offer is re-sent
    assert sender.poll(3.5) == [] and sender.failed is not None
    assert "no progress" in sender.failed


def test_a_refusing_follower_ends_the_transfer(tmp_path: Path) -> None:
    leader = Leader(tmp_path, segments=3, last_len=500)
    receiver = receiver_at(tmp_path, max_bytes=5000)
    sender = leader.sender()
    ack = receiver.on_offer(sender.start())
    assert not ack.ok and "at most 5000" in ack.reason
    assert sender.on_ack(ack, 0.0) == [] and sender.failed and "refused" in sender.failed
    assert receiver.refused == {"too_large": 1}
    # Not enough free disk either.
    tight = SnapshotReceiver(str(tmp_path / "g"), SEG, 1 << 30, free=lambda _: 100)
    assert not tight.on_offer(sender.offer).ok and tight.refused == {"disk_space": 1}


def offer(files: tuple[tuple[str, int], ...], end: int, first_index: int = 1) -> SnapshotOffer:
    return SnapshotOffer(1, 2, 5, 7, 100, 4, end, first_index, 0, files)


def seg(base: int) -> str:
    return "commitlog/" + file_name(base)


@pytest.mark.parametrize(("files", "end", "why"), [
    ((("state", 10),), 0, "no segment"),
    (((seg(0), 10), ("state", 10)), 10, "state file"),
    ((("state", 1), (seg(0), 4096), (seg(2 * SEG), 10)), 2 * SEG + 10, "does not follow"),
    ((("state", 1), (seg(100), 10)), 110, "grid"),
    ((("state", 1), (seg(0), SEG + 1)), SEG + 1, "announced"),
    ((("state", 1), (seg(0), 0)), 0, "announced"),
    ((("state", 1), (seg(0), 100)), 99, "end at"),
])
def test_bad_manifests_are_refused(tmp_path: Path, files: tuple[tuple[str, int], ...],
                                   end: int, why: str) -> None:
    receiver = receiver_at(tmp_path)
    ack = receiver.on_offer(offer(files, end))
    assert not ack.ok and why in ack.reason
    assert receiver.refused == {"manifest": 1}
    assert not (tmp_path / "f" / STAGING_DIR).exists()


def test_a_first_index_beyond_the_snapshot_is_refused(tmp_path: Path) -> None:
    ack = receiver_at(tmp_path).on_offer(offer((("state", 1), (seg(0), 100)), 100, 101))
    assert not ack.ok and "first index" in ack.reason


def chunk(file: str, offset: int, data: bytes, last: bool = False, crc: int | None = None,
          transfer: int = 7, term: int = 5) -> SnapshotChunk:
    return SnapshotChunk(1, 2, term, transfer, 100, file, offset, data,
                         crc32c(data) if crc is None else crc, last)


@pytest.fixture
def staging(tmp_path: Path) -> SnapshotReceiver:
    receiver = receiver_at(tmp_path)
    files = (("state", 4), (seg(0), SEG), (seg(SEG), 100))
    ack = receiver.on_offer(SnapshotOffer(1, 2, 5, 7, 100, 4, SEG + 100, 1, crc32c(b"SSSS"),
                                          files))
    assert ack.ok and ack.offset == 0
    return receiver


@pytest.mark.parametrize(("bad", "why"), [
    (chunk(seg(0), SEG - 10, b"x" * 20), "which holds"),       # past the file's announced size
    (chunk(seg(2 * SEG), 0, b"x"), "not in the manifest"),     # a file never offered
    (chunk("state", 0, b"SSSS", last=True), "end of stream"),  # a forged end
    (chunk("state", 0, b"SSSS", crc=1), "bad CRC"),            # a corrupted body
])
def test_forged_chunks_abort_the_staging(staging: SnapshotReceiver, tmp_path: Path,
                                         bad: SnapshotChunk, why: str) -> None:
    ack = staging.on_chunk(bad)
    assert ack is not None and not ack.ok and why in ack.reason
    assert staging.refused == {"forged": 1}
    assert staging.active is None
    assert not (tmp_path / "f" / STAGING_DIR).exists()


def test_out_of_order_chunks_are_not_written(staging: SnapshotReceiver) -> None:
    ack = staging.on_chunk(chunk(seg(0), 0, b"y" * 100))  # before the state file
    assert ack is not None and ack.ok and ack.offset == 0
    ack = staging.on_chunk(chunk("state", 0, b"SSSS"))
    assert ack is not None and ack.ok and ack.offset == 4
    ack = staging.on_chunk(chunk("state", 0, b"SSSS"))  # a duplicate
    assert ack is not None and ack.ok and ack.offset == 4
    assert staging.refused == {"out_of_order": 2}
    assert staging.staged(100, 4, SEG + 100) is None  # not complete


@pytest.mark.parametrize("other", [{"transfer": 8}, {"term": 4}],
                         ids=["another transfer id", "an earlier leader's"])
def test_a_chunk_of_another_transfer_is_refused(staging: SnapshotReceiver,
                                                other: dict[str, int]) -> None:
    ack = staging.on_chunk(chunk("state", 0, b"SSSS", **other))  # type: ignore[arg-type]
    assert ack is not None and not ack.ok and "no such transfer" in ack.reason
    assert staging.active is not None  # the transfer in progress is kept


def test_a_wrong_state_crc_is_caught_at_the_end(tmp_path: Path) -> None:
    receiver = receiver_at(tmp_path)
    files = (("state", 4), (seg(0), 10))
    assert receiver.on_offer(SnapshotOffer(1, 2, 5, 7, 100, 4, 10, 1, 12345, files)).ok
    assert receiver.on_chunk(chunk("state", 0, b"SSSS")).ok  # type: ignore[union-attr]
    ack = receiver.on_chunk(chunk(seg(0), 0, b"z" * 10, last=True))
    assert ack is not None and not ack.ok and "state file's CRC" in ack.reason
    assert receiver.staged(100, 4, 10) is None


def test_a_sender_ack_beyond_what_was_sent_fails_it(tmp_path: Path) -> None:
    sender = Leader(tmp_path, segments=2, last_len=500).sender()
    sender.on_ack(SnapshotAck(2, 1, 5, 7, 100, 0, True), 0.0)
    sent = sender.sent
    assert sender.on_ack(SnapshotAck(2, 1, 5, 7, 100, sent + 1, True), 0.0) == []
    assert sender.failed is not None and "only" in sender.failed


def test_sources_stay_readable_after_retention_deletes_them(tmp_path: Path) -> None:
    leader = Leader(tmp_path, segments=3, last_len=1000)
    sender = leader.sender()
    for base in leader.bases[:2]:
        os.remove(leader.segdir / file_name(base))
    receiver = receiver_at(tmp_path)
    run(sender, receiver)
    check_staged(leader, receiver, tmp_path)
    sender.close()


def test_sources_need_the_segment_holding_the_snapshot_end(tmp_path: Path) -> None:
    leader = Leader(tmp_path, segments=3, last_len=1000)
    with pytest.raises(SourceUnavailable, match="is gone"):
        open_sources(str(leader.state_path), str(leader.segdir), leader.bases[:2], SEG,
                     leader.end)
    with pytest.raises(SourceUnavailable, match="holds"):
        open_sources(str(leader.state_path), str(leader.segdir), leader.bases, SEG,
                     leader.bases[-1] + 1001)
    with pytest.raises(SourceUnavailable, match="contiguous"):
        open_sources(str(leader.state_path), str(leader.segdir),
                     [leader.bases[0], leader.bases[2]], SEG, leader.end)


# ------------------------------------------------------------------- codec


def raw(*fields: object) -> bytes:
    import msgpack
    packed: bytes = msgpack.packb(list(fields), use_bin_type=True)
    return packed


@pytest.mark.parametrize("payload", [
    raw(9, 1, 2, 5, 7, 100, "state", 0, b"abc", 1, False),                  # bad CRC
    raw(9, 1, 2, 5, 7, 100, "../../etc/passwd", 0, b"a", crc32c(b"a"), False),
    raw(9, 1, 2, 5, 7, 100, "commitlog/123", 0, b"a", crc32c(b"a"), False),
    raw(9, 1, 2, 5, 7, 100, "state", 0, b"", 0, False),                     # empty
    raw(9, 1, 2, 5, 7, 100, "state", 0, b"a" * (CHUNK_BYTES_MAX + 1),
        crc32c(b"a" * (CHUNK_BYTES_MAX + 1)), False),                       # oversized
    raw(9, 1, 2, 5, 7, 100, "state", -1, b"a", crc32c(b"a"), False),
    raw(9, 1, 2, 5, 7, 100, "state", 0, b"a", crc32c(b"a"), 1),             # last not a bool
    raw(9, 1, 2, 5, 7, 100, "state", 0, b"a", crc32c(b"a")),                # a field short
    raw(10, 2, 1, 5, 7, 100, 4, True, "but why"),                           # ok with a reason
    raw(10, 2, 1, 5, 7, 100, 4, False, "x" * 201),
    raw(8, 1, 2, 5, 7, 100, 4, 10, 1, 0, ["state", 1, "state", 1]),         # duplicate name
    raw(8, 1, 2, 5, 7, 100, 4, 10, 1, 0, ["state", 1, "commitlog/x"]),      # odd pairs
    raw(8, 1, 2, 5, 7, 100, 4, 10, 1, 2**32, ["state", 1]),                 # crc out of range
    raw(8, 1, 2, 5, 7, 100, 4, 10, 1, 0, ["state", 2**62, seg(0), 2**62]),  # total overflows
    raw(11, 1, 2, 5, 100, 4),                                               # a field short
    raw(11, 1, 2, 5, 100, 4, 2**63),                                        # end out of range
])
def test_the_codec_refuses_malformed_transfer_messages(payload: bytes) -> None:
    with pytest.raises(CodecError):
        decode_batch(payload, 1 << 22)


def test_the_codec_round_trips_transfer_messages() -> None:
    msgs: list[Message] = [
        SnapshotOffer(1, 2, 5, 2**64 - 1, 100, 4, SEG + 10, 3, 2**32 - 1,
                      (("state", 0), (seg(0), SEG), (seg(SEG), 10))),
        chunk(seg(SEG), 3, b"abc", last=True),
        SnapshotAck(2, 1, 5, 7, 100, 13, True),
        SnapshotAck(2, 1, 5, 7, 100, 0, False, "refused"),
        InstallSnapshot(1, 2, 5, 100, 4, SEG + 10),
    ]
    assert decode_batch(b"".join(encode_message(m) for m in msgs), 1 << 22) == msgs
