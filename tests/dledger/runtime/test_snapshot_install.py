"""Snapshot install between real `RaftGroupNode`s on 127.0.0.1.

A follower is stopped (or wiped) while the others fill several small
segments, write a snapshot at their applied index and delete the segments
below it; when it comes back, the entries it needs are gone, so it catches
up by install: the leader streams its snapshot's state and its segments,
the follower replaces its log with them and resets its state machine.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from node_harness import Cluster, wait_until

import commitlog
from commitlog.snapshot import SnapshotInfo, latest_snapshot, read_state, write_snapshot
from dledger.messages import Message
from dledger.runtime.codec import CodecError
from dledger.runtime.node import RaftGroupNode
from dledger.runtime.snapshot_transfer import (
    STAGING_DIR,
    SnapshotChunk,
    SnapshotOffer,
)
from ledgermq.base.loop import run

pytestmark = pytest.mark.timeout(120)

SEGMENT = 8192


def new_cluster(root: Path, **knobs: Any) -> Cluster:
    return Cluster(root, commitlog=commitlog.CommitLogConfig(segment_size_bytes=SEGMENT),
                   snapshot_chunk_bytes=4096, snapshot_window_bytes=16384,
                   snapshot_stall_s=2.0, **knobs)


def body(i: int) -> bytes:
    return b"entry-%06d-" % i + bytes(range(256))[: 200 + i % 50]


def state_at(index: int) -> bytes:
    """A test state machine's state: big enough for several chunks."""
    return b"".join(b"state-%08d-%06d;" % (index, k) for k in range(1500))


async def write(node: RaftGroupNode, lo: int, hi: int) -> None:
    await asyncio.gather(*(node.propose(commitlog.KIND_MESSAGES, body(i))
                           for i in range(lo, hi)))


def compact(node: RaftGroupNode) -> SnapshotInfo:
    """Snapshot the node's state machine at its applied index and delete the
    segments below the one holding that entry (as the broker's retention does)."""
    log = node.log
    index = node.applied_index
    end = log.entry_end(index)
    info = write_snapshot(node.config.data_dir, index, log.term_at(index), end, state_at(index))
    node.note_snapshot(info)
    assert log.delete_before(log.segments.base_of(end - 1)) > 0
    assert log.first_index > 1
    return info


def segment_files(node: RaftGroupNode) -> dict[str, bytes]:
    directory = os.path.join(node.config.data_dir, "commitlog")
    return {name: Path(directory, name).read_bytes() for name in sorted(os.listdir(directory))}


async def fall_behind(cluster: Cluster, wipe: bool = False) -> tuple[int, RaftGroupNode, int]:
    """Stop a follower, write past several segments, compact the others.
    Returns (the follower's id, the leader, the commit index it stopped at)."""
    leader = await cluster.wait_leader()
    await write(leader, 0, 40)
    await cluster.wait_converged()
    lagger = next(n for n in cluster.peers if n != leader.config.node_id)
    stopped_at = cluster.nodes[lagger].commit_index
    await cluster.stop(lagger)
    if wipe:
        shutil.rmtree(cluster.config(lagger).data_dir)
    await write(leader, 40, 400)
    await cluster.wait_converged()
    for node in cluster.nodes.values():
        await node.wait_durable(node.applied_index)
        compact(node)
    assert leader.log.first_index > stopped_at + 1
    return lagger, leader, stopped_at


@pytest.mark.parametrize("wipe", [False, True], ids=["restarted", "wiped"])
def test_a_follower_behind_retention_catches_up_by_install(tmp_path: Path, wipe: bool) -> None:
    async def main() -> None:
        cluster = new_cluster(tmp_path)
        await cluster.start_all()
        try:
            lagger, leader, _ = await fall_behind(cluster, wipe)
            snap = leader.storage.snapshot_info
            assert snap is not None
            node = await cluster.start(lagger)
            await wait_until(lambda: cluster.installs[lagger], 20, "the install")
            commit = await cluster.wait_converged()

            # Its state machine got the leader's snapshot state.
            [info] = cluster.installs[lagger]
            assert (info.index, info.term, info.end_position) == (
                snap.index, snap.term, snap.end_position)
            assert read_state(info) == state_at(snap.index)
            assert latest_snapshot(node.config.data_dir) == info
            # Its log is the leader's, byte for byte, from the same first index.
            assert node.log.first_index == leader.log.first_index
            assert segment_files(node) == segment_files(leader)
            assert not os.path.exists(os.path.join(node.config.data_dir, STAGING_DIR))
            # It applied what followed the snapshot, in order.
            after = [e.index for e in cluster.applied[lagger] if e.index > snap.index]
            assert after == list(range(snap.index + 1, commit + 1))
            assert node.applied_index == commit

            # A heartbeat answered while the install ran shows the follower's
            # old log, and the leader may start streaming the snapshot again
            # (a CI run under load saw it): that transfer ends on its own.
            await wait_until(lambda: leader.status().transfers == {}, 20,
                             "the leader's transfers to end")
            ls, ns = leader.status(), node.status()
            assert ls.counters.installs_sent >= 1 and ns.counters.installs_received == 1
            assert ls.counters.install_bytes_sent >= ns.counters.install_bytes_received > 0
            assert ns.counters.install_seconds > 0 and ls.counters.transfer_seconds > 0
            assert ns.first_index == leader.log.first_index
            assert ns.snapshot_index == snap.index

            # Replication goes on past the snapshot.
            await write(leader, 400, 450)
            commit = await cluster.wait_converged()
            assert segment_files(node) == segment_files(leader)
            assert cluster.applied[lagger][-1].index == commit
        finally:
            await cluster.stop_all()

    run(main())


def test_a_restart_after_an_install_replays_from_the_installed_snapshot(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = new_cluster(tmp_path)
        await cluster.start_all()
        try:
            lagger, leader, _ = await fall_behind(cluster)
            await cluster.start(lagger)
            await wait_until(lambda: cluster.installs[lagger], 20, "the install")
            commit = await cluster.wait_converged()
            await cluster.stop(lagger)
            # The saved commit covers the snapshot: a restart starts from it.
            node = RaftGroupNode(cluster.config(lagger), lambda entries: None)
            try:
                assert node.log.first_index == leader.log.first_index
                assert node.commit_index >= cluster.installs[lagger][0].index
                assert node.log.last_index >= commit - 1
            finally:
                await node.stop()
        finally:
            await cluster.stop_all()

    run(main())


def test_a_dropped_chunk_is_sent_again(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = new_cluster(tmp_path)
        await cluster.start_all()
        try:
            lagger, leader, _ = await fall_behind(cluster)
            sent = leader._transport.send
            dropped: list[SnapshotChunk] = []

            def lossy(messages: Any) -> None:
                keep = []
                for msg in messages:
                    if isinstance(msg, SnapshotChunk) and len(dropped) < 2 and msg.offset:
                        dropped.append(msg)  # the transport dropped it (buffer full)
                        continue
                    keep.append(msg)
                sent(keep)

            leader._transport.send = lossy  # type: ignore[method-assign]
            node = await cluster.start(lagger)
            await wait_until(lambda: cluster.installs[lagger], 30, "the install")
            await cluster.wait_converged()
            assert len(dropped) == 2
            counters = leader.status().counters
            assert counters.installs_sent == 1 and counters.install_failures == 0
            # What was dropped was sent again.
            assert counters.install_bytes_sent > node.status().counters.install_bytes_received
            assert segment_files(node) == segment_files(leader)
        finally:
            await cluster.stop_all()

    run(main())


def test_a_transfer_cut_by_the_leader_dying_is_retried_by_the_next(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = new_cluster(tmp_path)
        await cluster.start_all()
        try:
            lagger, leader, stopped_at = await fall_behind(cluster)
            node = await cluster.start(lagger)
            old_log = (node.log.first_index, node.log.last_index)
            receiver = node._receiver
            chunk_seen = receiver.on_chunk
            kill: list[asyncio.Task[None]] = []

            def on_chunk(chunk: SnapshotChunk) -> Any:
                ack = chunk_seen(chunk)
                if receiver.bytes_received > 20000 and not kill:
                    # Mid-stream: the leader dies.
                    kill.append(asyncio.get_running_loop().create_task(
                        cluster.stop(leader.config.node_id)))
                return ack

            receiver.on_chunk = on_chunk  # type: ignore[method-assign]
            await wait_until(lambda: kill and kill[0].done(), 20, "the leader to be killed")
            # Half a transfer staged changes nothing: the log is the old one.
            assert not cluster.installs[lagger]
            assert (node.log.first_index, node.log.last_index) == old_log
            assert old_log[1] >= stopped_at
            new_leader = await cluster.wait_leader()
            assert new_leader.config.node_id != leader.config.node_id
            await wait_until(lambda: cluster.installs[lagger], 30, "the install")
            await cluster.wait_converged()
            assert segment_files(node) == segment_files(new_leader)
            assert new_leader.status().counters.installs_sent == 1
        finally:
            await cluster.stop_all()

    run(main())


def test_forged_transfer_messages_are_refused(tmp_path: Path) -> None:
    from dledger.runtime.codec import encode_hello, encode_message
    from ledgermq.wire.codec import encode_frame

    async def main() -> None:
        cluster = new_cluster(tmp_path)
        await cluster.start_all()
        try:
            leader = await cluster.wait_leader()
            lid = leader.config.node_id
            follower_id = next(n for n in cluster.peers if n != lid)
            follower = cluster.nodes[follower_id]
            term = leader.term

            # A chunk whose CRC does not match its data: the connection is closed.
            port = cluster.peers[follower_id][1]
            bad = encode_message(SnapshotChunk(lid, follower_id, term, 1, 10, "state", 0,
                                               b"data", crc32c(b"data") ^ 1, False))
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(encode_frame(encode_hello("g1", lid, follower_id, "replication"))
                         + encode_frame(bad))
            async with asyncio.timeout(5.0):
                assert await reader.read(1) == b""
            writer.close()
            with pytest.raises(CodecError):
                from dledger.runtime.codec import decode_batch
                decode_batch(bad, 1 << 22)

            # An offer, then chunks that do not fit it: refused, nothing staged.
            sent: list[Message] = []
            real_send = follower._transport.send
            follower._transport.send = lambda msgs: (sent.extend(msgs),  # type: ignore
                                                     real_send(msgs))
            seg = "commitlog/" + "0" * 20
            offer = SnapshotOffer(lid, follower_id, term, 77, 10_000, term, 100, 1,
                                  crc32c(b"S"), (("state", 1), (seg, 100)))
            follower._deliver([offer])
            assert sent[-1].ok  # type: ignore[attr-defined]
            staging = os.path.join(follower.config.data_dir, STAGING_DIR)
            assert os.path.isdir(staging)
            # A chunk past the announced size of its file.
            follower._deliver([SnapshotChunk(lid, follower_id, term, 77, 10_000, seg, 90,
                                             b"x" * 20, crc32c(b"x" * 20), False)])
            assert not sent[-1].ok  # type: ignore[attr-defined]
            assert "holds 100" in sent[-1].reason  # type: ignore[attr-defined]
            assert not os.path.isdir(staging)
            refusals = follower.status().counters.transfer_refusals
            assert refusals == {"forged": 1}
            # The group keeps working.
            entry = await leader.propose(commitlog.KIND_MESSAGES, b"still-alive")
            assert entry.body == b"still-alive"
        finally:
            await cluster.stop_all()

    run(main())


@pytest.mark.parametrize("cut", ["before the adoption", "with the state moved, no meta"])
def test_a_crash_between_the_log_install_and_the_state_adoption_is_finished_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: str) -> None:
    import commitlog.snapshot as snapshot_module
    from dledger.runtime import node as node_module

    async def main() -> None:
        cluster = new_cluster(tmp_path)
        await cluster.start_all()
        try:
            lagger, leader, _ = await fall_behind(cluster)
            snap = leader.storage.snapshot_info
            assert snap is not None

            def power_cut(*args: Any, **kwargs: Any) -> SnapshotInfo:
                raise OSError(5, "power cut before the state was adopted")

            if cut == "before the adoption":
                monkeypatch.setattr(node_module, "adopt_snapshot", power_cut)
            else:
                monkeypatch.setattr(snapshot_module, "_commit_meta", power_cut)
            node = await cluster.start(lagger)
            await wait_until(lambda: node.failed is not None, 20, "the cut-short install")
            # The log is the leader's already; the state is not a snapshot yet.
            assert node.log.first_index == leader.log.first_index
            assert latest_snapshot(node.config.data_dir) is None
            staged_state = os.path.join(node.config.data_dir, STAGING_DIR, "state")
            assert os.path.isfile(staged_state) == (cut == "before the adoption")
            await cluster.stop(lagger)
            monkeypatch.undo()

            node = await cluster.start(lagger)  # constructing it finishes the install
            info = latest_snapshot(node.config.data_dir)
            assert info is not None and info.index == snap.index
            assert read_state(info) == state_at(snap.index)
            assert not os.path.exists(os.path.join(node.config.data_dir, STAGING_DIR))
            await cluster.wait_converged()
            assert segment_files(node) == segment_files(leader)
            assert node.status().counters.installs_received == 0  # nothing sent again
        finally:
            await cluster.stop_all()

    run(main())


def test_leftover_staging_is_dropped_at_start(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = new_cluster(tmp_path)
        await cluster.start_all()
        try:
            leader = await cluster.wait_leader()
            await write(leader, 0, 30)
            await cluster.wait_converged()
            follower_id = next(n for n in cluster.peers if n != leader.config.node_id)
            await cluster.stop(follower_id)
            data_dir = cluster.config(follower_id).data_dir
            # A transfer cut short by a crash: some chunks, no manifest.
            staged = Path(data_dir, STAGING_DIR, "commitlog")
            staged.mkdir(parents=True)
            Path(staged.parent, "state").write_bytes(b"half a state")
            (staged / ("0" * 20)).write_bytes(b"half a segment")
            node = await cluster.start(follower_id)
            assert not os.path.exists(os.path.join(data_dir, STAGING_DIR))
            assert latest_snapshot(data_dir) is None and node.log.first_index == 1
            await cluster.wait_converged()
        finally:
            await cluster.stop_all()

    run(main())
