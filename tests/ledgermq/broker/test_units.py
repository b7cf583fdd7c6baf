"""Pure parts: configuration, the state machine, group commit, allocation, membership."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from commitlog import KIND_CONTROL, KIND_MESSAGES, KIND_NOOP, Entry, Message, encode_messages
from ledgermq.broker.config import BrokerConfigError, load_config, parse_config
from ledgermq.broker.control import encode_control, offsets_commit, topic_delete, topic_put
from ledgermq.broker.group_commit import GroupCommitter
from ledgermq.broker.members import Membership
from ledgermq.broker.server import Broker
from ledgermq.broker.state import BrokerState, ProducerTable, Stored
from ledgermq.client.allocate import allocate_averagely

BASE = {
    "group": "g", "node_id": 1, "data_dir": "/tmp/x",
    "peers": {"1": {"raft": "127.0.0.1:1", "client": "127.0.0.1:2"},
              "2": {"raft": "127.0.0.1:3", "client": "127.0.0.1:4"}},
}


def test_config_file_round_trip(tmp_path) -> None:
    path = tmp_path / "b.toml"
    path.write_text('group = "g"\nnode_id = 2\ndata_dir = "d"\nnamesrv = "127.0.0.1:9876"\n'
                    'replicate = "async"\n[raft]\ntick_ms = 20\n'
                    '[peers.1]\nraft = "h:1"\nclient = "h:2"\n'
                    '[peers.2]\nraft = "h:3"\nclient = "h:4"\n')
    config = load_config(str(path))
    assert config.node_id == 2 and config.tick_ms == 20 and config.replicate == "async"
    assert (config.flush_interval_ms, config.flush_bytes) == (200, 4 << 20)  # defaults
    assert config.page_cache_tail_bytes == 1 << 30
    assert config.client_address == "h:4" and config.client_address_of(1) == "h:2"
    assert config.namesrv == ("127.0.0.1:9876",)
    assert config.with_overrides(flush="sync", replicate=None).flush == "sync"
    assert config.bootstrap_voters == {1, 2}  # initial_members left out: every peer
    spare = parse_config({**BASE, "initial_members": [1]})
    assert spare.bootstrap_voters == {1} and spare.initial_members == (1,)



@pytest.mark.parametrize("what, message", [
    ("binary", "not UTF-8 text (invalid start byte at byte 0)"),
    ("device", "not a regular file"),
    ("directory", "not a regular file"),
    ("huge", "more than 1048576 bytes"),
])
def test_a_config_path_that_is_not_a_config_file_is_one_error(tmp_path, what, message) -> None:
    """A binary file ended in a UnicodeDecodeError traceback; /dev/zero was
    read until memory ran out."""
    path = {"binary": tmp_path / "b.toml", "device": Path("/dev/zero"), "directory": tmp_path,
            "huge": tmp_path / "h.toml"}[what]
    if what == "binary":
        path.write_bytes(b"\xff\xfe" + bytes(range(256)))
    if what == "huge":
        path.write_text("# comment\n" * 200_000)
    with pytest.raises(BrokerConfigError, match=re.escape(message)):
        load_config(str(path))


def test_the_longest_allowed_election_timeout_is_accepted() -> None:
    config = parse_config({**BASE, "raft": {"tick_ms": 1000, "election_timeout_ticks": 600}})
    assert config.tick_ms * config.election_timeout_ticks == 600_000


def test_the_follower_apply_delay_reaches_the_node() -> None:
    config = parse_config({**BASE, "raft": {"follower_apply_delay_ms": 0}})
    assert config.follower_apply_delay_ms == 0
    assert parse_config(BASE).follower_apply_delay_ms == 5


def test_the_reserve_batch_reaches_the_node() -> None:
    config = parse_config({**BASE, "raft": {"reserve_batch_entries": 0}})
    assert config.reserve_batch_entries == 0
    assert Broker(config)._node_config().reserve_batch_entries == 0
    assert Broker(parse_config(BASE))._node_config().reserve_batch_entries == 8
    config = parse_config({**BASE, "raft": {"reserve_batch_bytes": 4096}})
    assert Broker(config)._node_config().reserve_batch_bytes == 4096
    assert Broker(parse_config(BASE))._node_config().reserve_batch_bytes == 64 * 1024


@pytest.mark.parametrize("change, message", [
    ({"flush": "never"}, "flush"),
    ({"node_id": 3}, "not in [peers]"),
    ({"bogus": 1}, "unknown configuration keys"),
    ({"raft": {"tick": 1}}, "unknown [raft] keys"),
    ({"default_queues": 0}, "default_queues"),
    ({"flush_interval_ms": 0}, "flush_interval_ms"),
    ({"flush_bytes": "big"}, "flush_bytes"),
    ({"page_cache_tail_bytes": -1}, "page_cache_tail_bytes"),
    ({"page_cache_tail_bytes": 1.5}, "page_cache_tail_bytes"),
    ({"peers": {"1": {"raft": "nohost"}}}, "needs 'raft' and 'client'"),
    ({"initial_members": [1, 7]}, "initial_members: 7 is not a node id"),
    ({"initial_members": "1,2"}, "initial_members must be a list"),
    ({"initial_members": [True]}, "initial_members: True"),
    ({"raft": {"leader_lost_grace_ticks": -1}}, "leader_lost_grace_ticks"),
    ({"raft": {"lost_leader_ticks": 0}}, "lost_leader_ticks"),
    ({"raft": {"follower_apply_delay_ms": -1}}, "follower_apply_delay_ms"),
    ({"raft": {"reserve_batch_entries": -1}}, "reserve_batch_entries"),
    ({"raft": {"reserve_batch_entries": 2.5}}, "reserve_batch_entries"),
    ({"raft": {"reserve_batch_bytes": 0}}, "reserve_batch_bytes"),
    ({"raft": {"reserve_batch_bytes": True}}, "reserve_batch_bytes"),
    # These three reached the Raft runtime, which refused them with a traceback.
    ({"raft": {"heartbeat_interval_ticks": 10}}, "heartbeat_interval_ticks must be in [1,"),
    ({"raft": {"election_timeout_ticks": 1}}, "election_timeout_ticks must be >= 2"),
    ({"raft": {"preferred_leader": 7}}, "preferred_leader 7 is not a node id in [peers]"),
    # And these started a broker that never elected a leader.
    ({"raft": {"tick_ms": 10**24}}, "longer than the longest election timeout"),
    ({"raft": {"election_timeout_ticks": 100_000}}, "= 5000000 ms is longer"),
    ({"raft": {"tick_ms": True}}, "tick_ms must be an integer"),
])
def test_config_errors_name_the_key(change, message) -> None:
    with pytest.raises(BrokerConfigError, match=message.replace("[", r"\[")):
        parse_config({**BASE, **change})


def _messages_entry(index: int, position: int, messages: list[Message]) -> Entry:
    return Entry(index, 1, KIND_MESSAGES, position, encode_messages(messages, 1 << 20))


def test_state_machine_applies_topics_offsets_and_queue_offsets() -> None:
    state = BrokerState()
    state.apply(Entry(1, 1, KIND_NOOP, 0, b""))
    state.apply(Entry(2, 1, KIND_CONTROL, 48, encode_control(
        [topic_put("t", 2), topic_put("u", 1, 4), topic_put("bad", 0)])))
    assert set(state.topics) == {"t", "u"} and state.topics["u"].perm == 4
    stored = state.apply(_messages_entry(3, 200, [
        Message("t", b"a", queue_id=1), Message("t", b"b", queue_id=1),
        Message("t", b"c", queue_id=0, producer_id=9, sequence=1)]))
    assert [(s.queue_id, s.queue_offset) for s in stored] == [(1, 0), (1, 1), (0, 0)]
    assert stored[0].physical_offset == 248
    assert state.producers.lookup(9, 1) == (True, stored[2])
    assert state.producers.lookup(9, 2) == (False, None)
    state.apply(Entry(4, 1, KIND_CONTROL, 900, encode_control(
        [offsets_commit([("cg", "t", 1, 2)]), topic_delete("u")])))
    state.apply(Entry(5, 1, KIND_CONTROL, 1000, encode_control(
        [offsets_commit([("cg", "t", 1, 1)])])))
    assert state.offset_of("cg", "t", 1) == 2  # never rewound
    assert state.offset_of("cg", "t", 0) == -1
    assert "u" not in state.topics
    state.apply(Entry(6, 1, KIND_CONTROL, 1100, b"\xc1 not msgpack"))
    assert state.bad_control_entries == 1
    with pytest.raises(ValueError, match="applied twice"):
        state.apply(Entry(6, 1, KIND_NOOP, 1200, b""))


def test_producer_table_window_and_capacity() -> None:
    table = ProducerTable(window=3, producers_max=2)
    for seq in range(1, 6):
        table.record(1, seq, Stored(seq, "t", 0, seq))
    assert table.lookup(1, 5)[1].queue_offset == 5
    assert table.lookup(1, 1) == (True, None)  # older than the window: known, no location
    assert table.lookup(1, 6) == (False, None)
    table.record(2, 1, Stored(1, "t", 0, 1))
    table.record(3, 1, Stored(1, "t", 0, 1))
    assert len(table) == 2 and table.lookup(1, 5) == (False, None)


def test_group_commit_batches_requests_while_a_proposal_is_in_flight() -> None:
    async def main() -> list[list[int]]:
        batches: list[list[int]] = []
        gate = asyncio.Event()

        async def flush(batch) -> None:  # type: ignore[no-untyped-def]
            batches.append([p.payload for p in batch])
            await gate.wait()
            for p in batch:
                p.future.set_result(p.payload * 10)

        committer = GroupCommitter(flush, max_count=3, max_bytes=1000, max_inflight=1)
        futures = [committer.submit(i, 1) for i in range(6)]
        await asyncio.sleep(0)
        gate.set()
        results = await asyncio.gather(*futures)
        assert results == [i * 10 for i in range(6)]
        return batches

    batches = asyncio.run(main())
    # Requests submitted in one loop iteration share the first proposal (up to
    # max_count); the rest queue while it is in flight and form the next one.
    assert batches == [[0, 1, 2], [3, 4, 5]]


def test_group_commit_failure_reaches_every_request() -> None:
    async def main() -> None:
        async def flush(batch) -> None:  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

        committer = GroupCommitter(flush, max_count=10, max_bytes=10)
        futures = [committer.submit(i, 1) for i in range(3)]
        for future in futures:
            with pytest.raises(RuntimeError, match="boom"):
                await future

    asyncio.run(main())


def test_group_commit_watches_a_flush_that_returns_a_future() -> None:
    """The send path's flush: it answers its requests from a callback on a
    future it returns (no task per proposal); the committer only watches it,
    fails what the callback left unanswered, and fails the batch of a flush
    that raises before returning."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        proposals: list[asyncio.Future[str]] = []
        tasks_before = len(asyncio.all_tasks())

        def flush(batch):  # type: ignore[no-untyped-def]
            if batch[0].payload == "refused":
                raise RuntimeError("not the leader")
            proposal: asyncio.Future[str] = loop.create_future()

            def answer(done: asyncio.Future[str]) -> None:
                if done.exception() is None:
                    for p in batch[:-1]:  # the last one is left to the committer
                        p.future.set_result(f"{p.payload}@{done.result()}")
            proposal.add_done_callback(answer)
            proposals.append(proposal)
            return proposal

        committer = GroupCommitter(flush, max_count=2, max_bytes=100, max_inflight=1)
        first = [committer.submit(f"m{i}", 1) for i in range(3)]
        await asyncio.sleep(0)
        assert len(proposals) == 1 and len(asyncio.all_tasks()) == tasks_before
        proposals[0].set_result("e1")  # m0 answered, m1 left unanswered
        assert await first[0] == "m0@e1"
        with pytest.raises(RuntimeError, match="unanswered"):
            await first[1]
        await asyncio.sleep(0)
        assert len(proposals) == 2  # m2 went out once the first was done
        proposals[1].set_exception(ValueError("lost"))
        with pytest.raises(ValueError, match="lost"):
            await first[2]
        refused = committer.submit("refused", 1)
        with pytest.raises(RuntimeError, match="not the leader"):
            await refused
        assert committer.batches == 3
        await committer.close()

    asyncio.run(main())


def test_group_commit_callbacks_and_a_flush_that_finishes_itself() -> None:
    """The send path's form: requests submitted with a callback are told
    synchronously when the flush resolves them; a flush that returns None
    calls `finish` (maybe before it returns, as a one-node group does),
    which fails what it left unanswered and frees the slot at once."""
    async def main() -> None:
        told: list[tuple[str, object, object]] = []
        batches: list[list[str]] = []
        committer: GroupCommitter[str, str]

        def flush(batch):  # type: ignore[no-untyped-def]
            batches.append([p.payload for p in batch])
            if batch[0].payload == "refused":
                raise RuntimeError("not the leader")
            for p in batch[:-1]:
                p.resolve(p.payload.upper())
            committer.finish(batch)  # the last one is left unanswered
            return None

        committer = GroupCommitter(flush, max_count=3, max_bytes=100, max_inflight=1)
        for name in ("a", "b", "c", "d"):
            committer.submit_then(name, 1, 1, lambda r, e, name=name: told.append((name, r, e)))
        await asyncio.sleep(0)
        assert batches == [["a", "b", "c"]]
        assert told[:2] == [("a", "A", None), ("b", "B", None)]
        assert told[2][0] == "c" and isinstance(told[2][2], RuntimeError)
        await asyncio.sleep(0)  # the slot was freed at once: "d" went next
        assert batches[-1] == ["d"] and isinstance(told[3][2], RuntimeError)
        committer.submit_then("refused", 1, 1, lambda r, e: told.append(("refused", r, e)))
        await asyncio.sleep(0)
        assert told[-1][0] == "refused" and "not the leader" in str(told[-1][2])
        await committer.close()

    asyncio.run(main())


def test_allocate_averagely_shares_queues_deterministically() -> None:
    queues = list(range(8))
    members = ["c", "a", "b"]
    shares = {m: allocate_averagely(queues, members, m) for m in members}
    assert shares == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}
    assert allocate_averagely([0, 1], ["a", "b", "c"], "c") == []
    assert allocate_averagely(queues, ["a"], "z") == []


def test_membership_expires_silent_members() -> None:
    members = Membership(expiry_ms=100)
    members.heartbeat("g", "b", {"t": "*"}, "clustering", 0)
    members.heartbeat("g", "a", {"t": "*"}, "clustering", 50)
    assert members.members("g", 60) == ["a", "b"]
    assert members.members("g", 120) == ["a"]
    assert members.leave("g", "a") and members.members("g", 120) == []


def test_wire_encoder_matches_the_storage_encoder() -> None:
    from commitlog import encode_message
    from commitlog.errors import MessageTooLargeError as StorageTooLarge
    from ledgermq.base.errors import InvalidRequestError
    from ledgermq.broker.codec import encode_wire_message

    wire = {"topic": "t-1", "body": b"payload", "queue_id": 3, "tags": "tg", "keys": "k1 k2",
            "properties": {"a": "b"}, "flag": 7, "born_timestamp_ms": 123, "born_host": "h:1",
            "producer_id": 9, "sequence": 4, "reconsume_times": 2}
    parsed = encode_wire_message(wire, 1 << 20)
    expected = encode_message(Message(
        "t-1", b"payload", queue_id=3, tags="tg", keys="k1 k2", properties={"a": "b"}, flag=7,
        born_timestamp_ms=123, born_host="h:1", producer_id=9, sequence=4, reconsume_times=2,
    ), 1 << 20)
    assert parsed.record == expected
    assert (parsed.topic, parsed.queue_id, parsed.producer_id, parsed.sequence) == (
        "t-1", 3, 9, 4)
    for bad in ({"topic": "a b"}, {"topic": "t", "queue_id": -1}, {"topic": "t", "body": 5},
                {"topic": "t", "properties": {"a": "\x01"}}, {"topic": "t", "tags": 1}, []):
        with pytest.raises(InvalidRequestError):
            encode_wire_message(bad, 1 << 20)
    with pytest.raises(StorageTooLarge):
        encode_wire_message({"topic": "t", "body": b"x" * 100}, 100)


@pytest.mark.parametrize("count", [5, 200])  # both ways of grouping records by queue
def test_queue_offsets_count_per_queue_in_log_order(count: int) -> None:
    state = BrokerState()
    expected: dict[int, int] = {}
    position = 0
    for index in (1, 2):
        messages = [Message("t", b"m", queue_id=(i * 7 + index) % 3, producer_id=4,
                            sequence=index * 1000 + i) for i in range(count)]
        stored = state.apply(_messages_entry(index, position, messages))
        position += 100_000
        for message, where in zip(messages, stored, strict=True):
            assert (where.queue_id, where.queue_offset) == (
                message.queue_id, expected.get(message.queue_id, 0))
            expected[message.queue_id] = where.queue_offset + 1
    assert state.producers.lookup(4, 2000 + count - 1)[1] == stored[count - 1]
