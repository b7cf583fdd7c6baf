"""SEND_MESSAGES with a `records` blob (client-encoded CommitLog records)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import (
    InvalidRequestError,
    MessageTooLargeError,
    NoPermissionError,
    UnknownTopicError,
)
from ledgermq.client.records import HEAD, decode_reply, encode_record
from tests.ledgermq.broker.test_broker_inprocess import Env, run


def rec(topic: str, body: bytes, queue_id: int = 0, pid: int = 0, seq: int = 0,
        tags: bytes = b"", keys: bytes = b"", props: bytes = b"") -> bytes:
    return encode_record(topic.encode(), queue_id, body, tags, keys, b"host:1", props, 0,
                         1234, pid, seq)


def test_records_are_stored_as_sent_and_answered_in_o1(tmp_path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 2})
            records = [rec("t", b"a", 0, tags=b"x"), rec("t", b"bb", 1), rec("t", b"c", 0,
                                                                               props=b"p\x01v\x02")]
            reply = await env.req(RequestCode.SEND_MESSAGES,
                                  {"records": b"".join(records), "count": 3})
            assert set(reply) == {"base", "queue_offsets"}
            results = decode_reply(reply, "g1", records, [("t", 0), ("t", 1), ("t", 0)])
            assert [(q, o) for _, q, o, _ in results] == [(0, 0), (1, 0), (0, 1)]
            # The same records again: next offsets, ids follow the sizes.
            again = decode_reply(await env.req(RequestCode.SEND_MESSAGES,
                                               {"records": b"".join(records)}),
                                 "g1", records, [("t", 0), ("t", 1), ("t", 0)])
            assert [(q, o) for _, q, o, _ in again] == [(0, 2), (1, 1), (0, 3)]
            pulled = await env.req(RequestCode.PULL_MESSAGES,
                                   {"topic": "t", "queue_id": 0, "offset": 0})
            got = pulled["messages"]
            assert [m["body"] for m in got] == [b"a", b"c", b"a", b"c"]
            assert [m["msg_id"] for m in got[:2]] == [results[0][0], results[2][0]]
            assert got[0]["tags"] == "x" and got[1]["properties"] == {"p": "v"}
            assert got[0]["store_timestamp_ms"] > 0 and got[0]["born_timestamp_ms"] == 1234
    run(main())


def test_records_idempotence_per_record(tmp_path) -> None:
    async def main() -> None:
        async with Env(tmp_path) as env:
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 1})
            first = [rec("t", b"1", pid=5, seq=1), rec("t", b"2", pid=5, seq=2)]
            reply = await env.req(RequestCode.SEND_MESSAGES, {"records": b"".join(first)})
            stored = decode_reply(reply, "g1", first, [("t", 0)] * 2)
            # A retry mixing an old and a new sequence (and one twice): the old
            # one is answered from the table, the new one stored once.
            mixed = [rec("t", b"2", pid=5, seq=2), rec("t", b"3", pid=5, seq=3),
                     rec("t", b"3", pid=5, seq=3)]
            reply = await env.req(RequestCode.SEND_MESSAGES, {"records": b"".join(mixed)})
            results = reply["results"]
            assert results[0]["duplicate"] and results[0]["msg_id"] == stored[1][0]
            assert not results[1]["duplicate"] and results[1]["queue_offset"] == 2
            assert results[2]["duplicate"] and results[2]["msg_id"] == results[1]["msg_id"]
            # Two concurrent requests with one record in common: the second
            # waits for the first's proposal and answers from it.
            one = [rec("t", b"4", pid=5, seq=4), rec("t", b"5", pid=5, seq=5)]
            two = [rec("t", b"5", pid=5, seq=5), rec("t", b"6", pid=5, seq=6)]
            a, b = await asyncio.gather(
                env.req(RequestCode.SEND_MESSAGES, {"records": b"".join(one)}),
                env.req(RequestCode.SEND_MESSAGES, {"records": b"".join(two)}))
            assert set(a) == {"base", "queue_offsets"}  # all new
            first_ids = decode_reply(a, "g1", one, [("t", 0)] * 2)
            assert b["results"][0]["duplicate"] and b["results"][0]["msg_id"] == first_ids[1][0]
            assert b["results"][0]["queue_offset"] == first_ids[1][2] == 4
            assert not b["results"][1]["duplicate"] and b["results"][1]["queue_offset"] == 5
            pulled = await env.req(RequestCode.PULL_MESSAGES,
                                   {"topic": "t", "queue_id": 0, "offset": 0})
            assert [m["body"] for m in pulled["messages"]] == [b"1", b"2", b"3", b"4", b"5",
                                                                b"6"]
    run(main())


def test_malformed_records_get_distinct_errors_and_store_nothing(tmp_path) -> None:
    async def main() -> None:
        async with Env(tmp_path, auto_create_topics=False) as env:
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 2})
            await env.req(RequestCode.CREATE_TOPIC, {"topic": "ro", "queues": 1, "perm": 4})
            good = rec("t", b"ok")
            wrong_size = bytearray(good)
            struct.pack_into("<I", wrong_size, 0, len(good) + 1)
            sys_flag = bytearray(good)
            struct.pack_into("<I", sys_flag, 12, 1)
            bad_utf8 = rec("t", b"x", tags=b"\xff\xfe")
            cases = {
                "empty": (b"", InvalidRequestError),
                "not_binary": ("text", InvalidRequestError),
                "short_head": (good + good[:40], InvalidRequestError),
                "truncated_body": (good + good[:-1], InvalidRequestError),
                "wrong_size": (bytes(wrong_size) + good, InvalidRequestError),
                "sys_flag": (good + bytes(sys_flag), InvalidRequestError),
                "bad_topic": (good + rec("bad topic!", b"x"), InvalidRequestError),
                "bad_utf8": (good + bad_utf8, InvalidRequestError),
                "bad_queue": (good + rec("t", b"x", queue_id=2), InvalidRequestError),
                "unknown_topic": (good + rec("nope", b"x"), UnknownTopicError),
                "read_only": (good + rec("ro", b"x"), NoPermissionError),
                "too_large": (good + rec("t", b"x" * 70_000), MessageTooLargeError),
            }
            for name, (blob, error) in cases.items():
                with pytest.raises(error) as info:
                    await env.req(RequestCode.SEND_MESSAGES, {"records": blob})
                assert type(info.value) is error, name
            with pytest.raises(MessageTooLargeError) as info:
                await env.req(RequestCode.SEND_MESSAGES,
                              {"records": good + rec("t", b"x" * 70_000)})
            assert info.value.data["index"] == 1 and info.value.data["limit"] == 64 * 1024
            with pytest.raises(InvalidRequestError, match="count"):
                await env.req(RequestCode.SEND_MESSAGES, {"records": good, "count": 2})
            for queue in (0, 1):
                offsets = await env.req(RequestCode.GET_QUEUE_OFFSETS,
                                        {"topic": "t", "queue_id": queue})
                assert offsets == {"min_offset": 0, "max_offset": 0}
            assert HEAD.size == 68
    run(main())
