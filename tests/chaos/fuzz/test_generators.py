"""The fuzz generators, without servers: every request code has a body schema,
cases are pure functions of their seed, protected names never appear, and the
Raft cases never carry a message a correct node would accept."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from chaos.fuzz import campaign
from chaos.fuzz.bodies import SCHEMAS, body_for
from chaos.fuzz.cases import GENERATORS, RAFT, Case, build
from chaos.fuzz.plan import Context
from chaos.fuzz.values import Names
from dledger.runtime.codec import CodecError, decode_batch, decode_hello
from ledgermq.base.codes import RequestCode
from ledgermq.wire.codec import FrameDecoder

PROTECTED = frozenset({"fuzz-acked", "broker-a"})
CTX = Context(names=Names(protected=PROTECTED), admin_token="t")
ALL = [(kind, name) for kind, gens in GENERATORS.items() for name in gens]


def test_every_request_code_has_a_structure_aware_body() -> None:
    missing = [code.name for code in RequestCode if code not in SCHEMAS]
    assert not missing, f"add a body schema to chaos/fuzz/bodies.py for {missing}"


def test_unknown_codes_still_get_a_body() -> None:
    import random

    rng = random.Random(5)
    bodies = [body_for(12345, rng, CTX.names) for _ in range(50)]
    assert len({repr(b) for b in bodies}) > 10


@pytest.mark.parametrize(("kind", "name"), ALL)
def test_cases_are_pure_functions_of_their_seed(kind: str, name: str) -> None:
    for seed in range(60):
        case = Case(0, "t", kind, name, seed, 1 if kind == RAFT else 0)
        first = build(case, CTX)
        assert first.chunks == build(case, CTX).chunks
        # A Raft handshake must name the group, and so does a message id
        # (<group>@<offset>, read-only); otherwise the client and admin ports
        # never see a name the oracle reads.
        for raw in first.chunks if kind != RAFT else ():
            chunk = raw.replace(b"broker-a%40", b"").replace(b"broker-a@", b"")
            for protected in PROTECTED:
                assert protected.encode() not in chunk, (name, seed)
    assert build(Case(0, "t", kind, name, 1, 1), CTX).chunks != \
        build(Case(0, "t", kind, name, 2, 1), CTX).chunks or name == "raw_bytes"


@pytest.mark.parametrize("name", list(GENERATORS[RAFT]))
def test_raft_cases_never_carry_an_acceptable_message(name: str) -> None:
    """What runtime_transport would do with each frame: a frame after a valid
    handshake must fail to decode, or name a sender/addressee other than the
    handshake's, so that nothing of a case ever reaches the Raft core."""
    delivered = 0
    for seed in range(400):
        plan = build(Case(0, "t", RAFT, name, seed, 1), CTX)
        decoder = FrameDecoder(64 << 20)
        try:
            frames = decoder.feed(b"".join(plan.chunks))
        except Exception:
            continue
        if not frames:
            continue
        try:
            hello = decode_hello(frames[0])
        except CodecError:
            continue
        if hello["group"] != CTX.group or hello["dst"] != 1 or hello["src"] not in (2, 3):
            continue
        for frame in frames[1:]:
            try:
                messages = decode_batch(frame, 64 << 20)
            except CodecError:
                break
            if all(m.src == hello["src"] and m.dst == 1 for m in messages):
                delivered += 1
            break  # the transport closes at the first refused frame
    assert delivered == 0


def test_wedge_term_is_what_the_old_codec_let_through() -> None:
    plan = build(Case(0, "t", RAFT, "wedge_term", 9, 1), CTX)
    frames = FrameDecoder().feed(b"".join(plan.chunks))
    msg = msgpack.unpackb(frames[1])
    assert msg[3] == 2**64 - 1
    with pytest.raises(CodecError):
        decode_batch(frames[1], 1 << 20)


def test_draw_cases_follows_the_run_seed() -> None:
    ports = [("a/wire", "wire", "h:1", 0), ("b/raft", "raft", "h:2", 2),
             ("c/http", "http", "h:3", 0)]
    first = [c for _, c in zip(range(50), campaign.draw_cases(7, ports), strict=False)]
    again = [c for _, c in zip(range(50), campaign.draw_cases(7, ports), strict=False)]
    other = [c for _, c in zip(range(50), campaign.draw_cases(8, ports), strict=False)]
    assert first == again and first != other
    assert {c.target for c in first} == {"a/wire", "b/raft", "c/http"}
    only = [c for _, c in zip(range(20), campaign.draw_cases(7, ports, frozenset({"wedge_term"})),
                              strict=False)]
    assert {(c.target, c.generator) for c in only} == {("b/raft", "wedge_term")}


def test_seed_log_lines_load_back_as_cases(tmp_path: Path) -> None:
    case = Case(3, "broker-1/raft", RAFT, "extreme_fields", 99, 1)
    log = tmp_path / campaign.SEEDS_FILE
    log.write_text(json.dumps({"run_seed": 1}) + "\n"
                   + json.dumps({"case": 3, "target": case.target, "kind": case.kind,
                                 "generator": case.generator, "seed": 99, "node": 1}) + "\n"
                   + json.dumps({"summary": {}}) + "\n")
    assert campaign.load_cases(log) == [case]
    assert campaign.load_cases(log, {4}) == []


def test_no_finding_is_excused() -> None:
    """The two admin 500s the fuzzer found are fixed (tests/ops/test_admin_api.py
    holds their regressions), so every finding fails a run again."""
    assert campaign.KNOWN_FINDINGS == ()
    deep = ('HTTP 500 (POST /api/v1/topics): {"error": {"code": "INTERNAL", "message": '
            '"RecursionError: maximum recursion depth exceeded while decoding a JSON array"}}')
    assert not campaign.is_known(deep)
