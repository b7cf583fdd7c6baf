"""What a fuzz case is made of: the bytes to send and the context they depend on.

A generator is a function `(random.Random, Context) -> Plan`. The context
holds only what the bytes may depend on and that is the same on every run of
a given cluster shape (group name, node ids, protected names), never ports,
so a recorded (generator, seed) rebuilds the same bytes against a new cluster.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from chaos.fuzz.values import Names


@dataclass(frozen=True)
class Context:
    """The cluster facts a case may use. `node` is the Raft target's id;
    `admin_token` goes into most HTTP cases so writes reach their handlers."""

    names: Names
    group: str = "broker-a"
    node_ids: tuple[int, ...] = (1, 2, 3)
    node: int = 1
    max_frame_bytes: int = 16 * 1024 * 1024
    admin_token: str = ""


@dataclass
class Plan:
    """Chunks written one after another on one connection (`pause_s` between
    them), then the write side is shut down when `half_close`; `requests` is
    how many answers may come back, so reading can stop early."""

    chunks: list[bytes]
    requests: int = 0
    half_close: bool = True
    pause_s: float = 0.0
    note: str = ""
    extra: dict[str, object] = field(default_factory=dict)


Generator = Callable[[random.Random, Context], Plan]
