"""Loaded by every Python process started with this folder on PYTHONPATH
(bench/timeline.py puts it there for the brokers it launches, and imports
it itself for the client).

With LEDGERMQ_TIMELINE_DIR set, it wraps the points where a process's
bytes enter and leave (a frame read, a write to a peer or a client) and the
Raft node's and broker's main steps, each with a timestamp at entry and exit
(time.perf_counter_ns: CLOCK_MONOTONIC, one clock for every process on the
host); SIGUSR1 starts recording, SIGUSR2 stops it and writes
`<pid>.timeline` (pickled [(ns, label), ...]) into that folder. A stamp
costs about half a microsecond. Without the variable this does nothing. Not
part of the product: the wheel does not ship bench/.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

_DIR = os.environ.get("LEDGERMQ_TIMELINE_DIR")
events: list[tuple[int, str]] = []
recording = False


def start(*_: object) -> None:
    global recording
    recording = True


def stop(*_: object) -> None:
    global recording
    recording = False


def _wrap(cls: type, name: str, label: str) -> None:
    import time
    original: Callable[..., Any] = getattr(cls, name)
    now = time.perf_counter_ns
    add = events.append

    def stamped(self: object, *args: Any, **kwargs: Any) -> Any:
        if not recording:
            return original(self, *args, **kwargs)
        add((now(), label))
        try:
            return original(self, *args, **kwargs)
        finally:
            add((now(), label + "/end"))

    setattr(cls, name, stamped)


# (module, class, method, label): where bytes arrive and leave, then the steps.
EDGES = [
    ("ledgermq.wire.server_connection", "ServerConnection", "data_received", "request_in"),
    ("ledgermq.wire.frame_protocol", "FrameProtocol", "data_received", "frame_in"),
    ("ledgermq.wire.streams", "FrameWriter", "_write_pending", "answer_out"),
    ("dledger.runtime.transport", "_Link", "send", "peer_out"),
]
STEPS = [
    ("dledger.runtime.node", "RaftGroupNode", "_deliver", "node.deliver"),
    ("dledger.runtime.node", "RaftGroupNode", "_propose_round", "node.propose_round"),
    ("dledger.runtime.node", "RaftGroupNode", "_write", "node.write"),
    ("dledger.runtime.node", "RaftGroupNode", "_apply", "node.apply"),
    ("dledger.runtime.node", "RaftGroupNode", "_run_completions", "node.completions"),
    ("dledger.raw_node", "RaftNode", "step", "core.step"),
    ("dledger.raw_node", "RaftNode", "ready", "core.ready"),
    ("dledger.raw_node", "RaftNode", "advance", "core.advance"),
    ("ledgermq.broker.server", "Broker", "_apply", "broker.apply"),
    ("ledgermq.broker.server", "Broker", "_apply_rest", "broker.apply_rest"),
    ("ledgermq.broker.group_commit", "GroupCommitter", "_start", "group_commit.start"),
]


def install() -> None:
    import importlib
    for module, cls, name, label in EDGES + STEPS:
        owner = getattr(importlib.import_module(module), cls)
        if hasattr(owner, name):  # an older tree may lack a step
            _wrap(owner, name, label)


if _DIR:
    import pickle
    import signal
    from types import FrameType

    def _dump(_signum: int, _frame: FrameType | None) -> None:
        stop()
        with open(os.path.join(_DIR, f"{os.getpid()}.timeline"), "wb") as out:
            pickle.dump(events, out)

    install()
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, _dump)
