"""A fuzz case's identity and how it is built.

A case is (target kind, generator name, seed): `build` seeds a
`random.Random` with the seed and calls the generator, so the same triple
and the same `Context` always give the same bytes. `GENERATORS` lists, per
kind of port, the generators that apply and their weights.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from chaos.fuzz import http_cases, raft_cases, wire_cases
from chaos.fuzz.plan import Context, Generator, Plan

WIRE = "wire"  # the client protocol port of a broker or the NameServer
RAFT = "raft"  # a broker's Raft peer port
HTTP = "http"  # an admin HTTP app

GENERATORS: dict[str, dict[str, tuple[Generator, int]]] = {
    WIRE: {
        "random_bytes": (wire_cases.random_bytes, 1),
        "random_after_hello": (wire_cases.random_after_hello, 1),
        "bad_header": (wire_cases.bad_header, 1),
        "truncated": (wire_cases.truncated, 1),
        "bad_zstd": (wire_cases.bad_zstd, 1),
        "garbage_payload": (wire_cases.garbage_payload, 2),
        "bad_hello": (wire_cases.bad_hello, 1),
        "requests": (wire_cases.requests, 8),
        "every_code": (wire_cases.every_code, 2),
    },
    RAFT: {
        "raw_bytes": (raft_cases.raw_bytes, 1),
        "bad_handshake": (raft_cases.bad_handshake, 2),
        "garbage_after_handshake": (raft_cases.garbage_after_handshake, 3),
        "extreme_fields": (raft_cases.extreme_fields, 4),
        "wedge_term": (raft_cases.wedge_term, 1),
    },
    HTTP: {
        "http_request": (http_cases.http_request, 5),
        "broken_http": (http_cases.broken_http, 1),
    },
}


@dataclass(frozen=True)
class Case:
    """One case: `target` names the server (e.g. "broker-2/raft"); `node` is the
    Raft target's node id (0 for other ports)."""

    number: int
    target: str
    kind: str
    generator: str
    seed: int
    node: int = 0


def pick_generator(rng: random.Random, kind: str, only: frozenset[str] | None = None) -> str:
    """A generator name for `kind`, by weight, among `only` when given."""
    names = [n for n in GENERATORS[kind] if only is None or n in only]
    if not names:
        raise ValueError(f"no {kind} generator among {sorted(only or ())}")
    return rng.choices(names, weights=[GENERATORS[kind][n][1] for n in names])[0]


def build(case: Case, ctx: Context) -> Plan:
    """The bytes of `case`: a pure function of (kind, generator, seed, context)."""
    generator = GENERATORS[case.kind][case.generator][0]
    if case.node:
        ctx = replace(ctx, node=case.node)
    return generator(random.Random(case.seed), ctx)
