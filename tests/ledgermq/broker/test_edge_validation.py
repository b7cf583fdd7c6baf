"""Identifiers are checked at the edge of the broker protocol (issue 15).

Every bad topic name, group name, queue id, offset or client id is answered
INVALID_REQUEST (or UNKNOWN_TOPIC for a well-formed name that does not exist)
before anything is looked up, proposed to the Raft log or stored in the
replicated state; a real broker over a real socket, and the state and log
are checked afterwards.
"""

from __future__ import annotations

import os

import pytest

from ledgermq.base import loop
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import InvalidRequestError, LedgerMQError, UnknownTopicError
from ledgermq.broker.config import BrokerConfig, Peer
from ledgermq.broker.launcher import free_port
from ledgermq.broker.server import Broker
from ledgermq.wire import RpcClient

pytestmark = pytest.mark.timeout(60)

BAD_TOPICS = ["x" * 70_000, "../../etc/passwd", "", "a b", "t\x00", "é", "t\n"]
BAD_GROUPS = ["g" * 256, "../../etc/passwd", "", "a/b", "g\n"]
BAD_QUEUES = [2**64 - 1, 2**31, -1, True, 1.0, "0", None]
BAD_OFFSETS = [-1, 2**63, 2**64 - 1, True, 0.5, "1", None]


async def _broker(tmp_path) -> tuple[Broker, RpcClient]:
    config = BrokerConfig(
        group="g1", node_id=1, data_dir=str(tmp_path / "n1"),
        peers={1: Peer(f"127.0.0.1:{free_port()}", "127.0.0.1:0")},
        segment_size_bytes=1 << 20, tick_ms=10, auto_create_topics=False)
    broker = Broker(config)
    host, port = await broker.start()
    await broker.node.wait_leader_ready(10)
    client = await RpcClient.connect(host, port)
    await client.request(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 2})
    await client.request(RequestCode.SEND_MESSAGES,
                         {"messages": [{"topic": "t", "body": b"m", "queue_id": 0}]})
    return broker, client


async def _refused(client: RpcClient, code: int, body: object) -> LedgerMQError:
    with pytest.raises(LedgerMQError) as info:
        await client.request(code, body)
    return info.value


def test_commit_offsets_refuses_every_bad_identifier_before_the_log(tmp_path) -> None:
    async def main() -> None:
        broker, client = await _broker(tmp_path)
        try:
            last = broker.node.log.last_index
            commit = RequestCode.COMMIT_OFFSETS
            bodies = (
                [{"group": "grp", "offsets": [[t, 0, 0]]} for t in BAD_TOPICS]
                + [{"group": "grp", "offsets": [["t", q, 0]]} for q in BAD_QUEUES]
                + [{"group": "grp", "offsets": [["t", 0, o]]} for o in BAD_OFFSETS]
                + [{"group": g, "offsets": [["t", 0, 0]]} for g in [*BAD_GROUPS, True, 7]]
                + [{"group": "grp", "offsets": [["t", 2, 0]]},  # t has queues 0 and 1
                   {"group": "grp", "offsets": [["t", 0]]},
                   {"group": "grp", "offsets": {"t": 0}},
                   {"group": "grp", "offsets": [["t", 0, 1], [7, 0, 0]]},
                   ["grp"]]
            )
            for body in bodies:
                error = await _refused(client, commit, body)
                assert isinstance(error, InvalidRequestError), (str(body)[:80], error)
                # The message names the problem without echoing 70,000 characters.
                assert len(error.message) < 300
            unknown = await _refused(client, commit,
                                     {"group": "grp", "offsets": [["nope", 0, 0]]})
            assert isinstance(unknown, UnknownTopicError)
            # Nothing reached the log or the replicated state.
            assert broker.node.log.last_index == last
            assert broker.state.offsets == {}
            # A good commit still goes through.
            await client.request(commit, {"group": "grp", "offsets": [["t", 0, 1]]})
            assert broker.state.offsets == {("grp", "t", 0): 1}
        finally:
            await client.close()
            await broker.stop()
    loop.run(main())


def test_reads_and_heartbeats_check_identifiers(tmp_path) -> None:
    async def main() -> None:
        broker, client = await _broker(tmp_path)
        try:
            cases: list[tuple[int, object]] = []
            for t in BAD_TOPICS:
                cases += [(RequestCode.PULL_MESSAGES, {"topic": t, "queue_id": 0, "offset": 0}),
                          (RequestCode.GET_QUEUE_OFFSETS, {"topic": t, "queue_id": 0}),
                          (RequestCode.QUERY_OFFSET, {"group": "g", "topic": t, "queue_id": 0}),
                          (RequestCode.DELETE_TOPIC, {"topic": t}),
                          (RequestCode.CLIENT_HEARTBEAT,
                           {"group": "g", "client_id": "c", "subscriptions": {t: "*"}})]
            for q in BAD_QUEUES:
                cases += [(RequestCode.PULL_MESSAGES, {"topic": "t", "queue_id": q, "offset": 0}),
                          (RequestCode.GET_QUEUE_OFFSETS, {"topic": "t", "queue_id": q}),
                          (RequestCode.QUERY_OFFSET, {"group": "g", "topic": "t",
                                                      "queue_id": q})]
            for o in BAD_OFFSETS:
                cases.append((RequestCode.PULL_MESSAGES,
                              {"topic": "t", "queue_id": 0, "offset": o}))
            for g in BAD_GROUPS:
                cases += [(RequestCode.QUERY_OFFSET, {"group": g, "topic": "t", "queue_id": 0}),
                          (RequestCode.GET_MEMBERS, {"group": g}),
                          (RequestCode.CLIENT_HEARTBEAT, {"group": g, "client_id": "c"})]
            cases += [
                (RequestCode.GET_QUEUE_OFFSETS, {"topic": "t", "queue_id": 2}),
                (RequestCode.PULL_MESSAGES, {"topic": "t", "queue_id": 2, "offset": 0}),
                (RequestCode.CLIENT_HEARTBEAT, {"group": "g", "client_id": "c" * 256}),
                (RequestCode.CLIENT_HEARTBEAT, {"group": "g", "client_id": "a\nb"}),
                (RequestCode.CLIENT_HEARTBEAT, {"group": "g", "client_id": "c",
                                                "subscriptions": {"t": "x" * 5000}}),
                (RequestCode.CLIENT_HEARTBEAT, {"group": "g", "client_id": "c",
                                                "subscriptions": {f"t{i}": "*"
                                                                  for i in range(1025)}}),
            ]
            for code, body in cases:
                error = await _refused(client, code, body)
                assert isinstance(error, InvalidRequestError), (code, str(body)[:80], error)
            assert broker.members.members("g", 0) == []
            # Good requests are still answered.
            pulled = await client.request(RequestCode.PULL_MESSAGES,
                                          {"topic": "t", "queue_id": 0, "offset": 0})
            assert [m["body"] for m in pulled["messages"]] == [b"m"]
            assert await client.request(RequestCode.QUERY_OFFSET,
                                        {"group": "g", "topic": "t", "queue_id": 1}) \
                == {"offset": -1}
        finally:
            await client.close()
            await broker.stop()
    loop.run(main())


def test_topic_creation_and_sends_refuse_every_bad_topic_name(tmp_path) -> None:
    """Before names were matched whole, "t\n" was a topic: created, written
    to, and given a ConsumeQueue directory named with a newline."""
    async def main() -> None:
        broker, client = await _broker(tmp_path)
        try:
            last = broker.node.log.last_index
            for t in BAD_TOPICS:
                for code, body in ((RequestCode.CREATE_TOPIC, {"topic": t, "queues": 2}),
                                   (RequestCode.SEND_MESSAGES,
                                    {"messages": [{"topic": t, "body": b"m", "queue_id": 0}]})):
                    error = await _refused(client, code, body)
                    assert isinstance(error, InvalidRequestError), (code, t[:20], error)
            assert broker.node.log.last_index == last
            assert set(broker.state.topics) == {"t"}
            queues = tmp_path / "n1" / "consumequeue"
            assert [n for n in os.listdir(queues) if n != "checkpoint"] == ["t"]
        finally:
            await client.close()
            await broker.stop()
    loop.run(main())
