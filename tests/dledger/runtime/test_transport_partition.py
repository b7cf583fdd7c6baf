"""A partition that drops packets (no reset) and then heals: the peer
transport is talking again within seconds, on real sockets in a network
namespace whose links iptables cuts (chaos.netns).

A connection such a partition cuts stays open on both sides; TCP retransmits
what is unacknowledged, each time twice as long after the last (0.2 s, 0.4 s,
... up to 2 minutes), so without a bound a link comes back only at its next
retransmission: 12.4 s after a 14 s partition here (0.4 s with the bound,
as measured while this test was written),
tens of seconds after a minute (a chaos run of 2026-12-07 saw a healed node
hear nothing from its leader for the 40 s that were left). With `user_timeout_s` the kernel aborts
a connection whose bytes stay unacknowledged that long, and the link
re-dials every 0.5 s at most.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from chaos.backend import ClusterSpec
from chaos.netns import NetnsBackend, netns_available, node_ip
from dledger.messages import Heartbeat, Message
from dledger.runtime.transport import PEER_USER_TIMEOUT_S, PeerTransport
from ledgermq.base.loop import run
from tests.support import is_root, require

pytestmark = pytest.mark.timeout(120)

PORT = 7100
PARTITION_S = 14.0
T = TypeVar("T")


def in_namespace(enter: Callable[[], None], main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on an event loop of a thread that entered the namespace."""
    out: list[T] = []
    failed: list[BaseException] = []

    def body() -> None:
        try:
            enter()
            out.append(run(main))
        except BaseException as exc:  # re-raised in the test's thread
            failed.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]


async def control_connects(backend: NetnsBackend) -> tuple[int, int]:
    """Connections node 1's control link to node 2 made before the partition
    and by the time node 2 hears node 1 again after the heal."""
    received: list[Message] = []
    peers = {n: (node_ip(n), PORT) for n in (1, 2)}
    # Each dials from its own address (as the brokers do, `bind_host`): the
    # partition's rules match the pair of addresses.
    one = PeerTransport("g1", 1, peers, lambda _msgs: None, handshake_timeout=2.0,
                        bind_host=node_ip(1))
    two = PeerTransport("g1", 2, peers, received.extend, handshake_timeout=2.0,
                        bind_host=node_ip(2))
    await one.start()
    await two.start()
    try:
        term = 0

        async def beat_until_heard(timeout: float) -> None:
            nonlocal term
            deadline = time.monotonic() + timeout
            term += 1
            while not any(m.term == term for m in received):
                assert time.monotonic() < deadline, f"heartbeat of term {term} never arrived"
                one.send([Heartbeat(1, 2, term, 0)])
                await asyncio.sleep(0.05)

        await beat_until_heard(10.0)  # the links are up
        before = one.stats()["links"]["2/control"]["connects"]
        backend.drop(1, 2)
        backend.drop(2, 1)
        started = time.monotonic()
        cut_at = len(received)
        while time.monotonic() - started < PARTITION_S:
            # Heartbeats as a leader sends them: unacknowledged bytes on the
            # link that the partition leaves open.
            one.send([Heartbeat(1, 2, term, 0)])
            await asyncio.sleep(0.05)
        assert len(received) <= cut_at + 1, "the partition let heartbeats through"
        backend.heal()
        await beat_until_heard(60.0)
        return before, one.stats()["links"]["2/control"]["connects"]
    finally:
        await one.close()
        await two.close()


def test_a_link_a_silent_partition_cut_is_aborted_and_re_dialled(tmp_path: Path) -> None:
    require(is_root() and netns_available() is None, "needs root, ip and iptables")
    assert PARTITION_S > 2 * PEER_USER_TIMEOUT_S
    backend = NetnsBackend(ClusterSpec(nodes=2), tmp_path, log=lambda _m: None)
    backend.create_namespace()
    try:
        before, after = in_namespace(backend.client_thread_init(), control_connects(backend))
    finally:
        backend.close()
    # The kernel aborted the connection the partition left open, and the link
    # dialled a new one (the old code kept the first connection, and was heard
    # again only at TCP's next backed-off retransmission).
    assert before == 1 and after >= 2, (before, after)
