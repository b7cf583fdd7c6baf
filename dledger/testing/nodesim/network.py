"""`SimNetwork` and `SimTransport`: the peer transport of the real node, simulated.

`SimTransport` is what `NodeIO.transport` builds for a simulated node. It
encodes each Ready's messages with the real codec (`dledger.runtime.codec`,
one payload per peer and channel, as `PeerTransport` writes them) and hands
the payloads to the network; the network decodes them on the receiving
node's loop at a seeded virtual time and calls that node's `_deliver`, the
same entry point the TCP transport uses.

Like the two TCP connections per direction, each (src, dst, channel) link is
FIFO: a message is never delivered before one sent earlier on its link, so a
long delay (past an election timeout) stalls the messages behind it, as a
stalled connection does. Faults: loss, duplication, long delays, partitions
(blocked directed links); a `CodecError` from `_deliver` (the core refused a
message) drops everything in flight on that link, as the connection reset
that the real transport does would.

Connections (`model_connections`, off by default): the node's leader watch
asks its transport whether every connection with a peer is closed
(`peer_lost`). With the model off every peer looks connected, as the
network has no connections; with it on, a peer looks lost while its process
is gone *and* closed its connections (`detach_node(closes=True)`: a killed
process; a machine that lost power closes nothing, and a node that stops its
transport closes them), while a `reset` of the pair lasts (its in-flight
messages are dropped and new ones too, as on a connection being re-dialled),
and while a `phantom` lasts (the observer's transport says so wrongly; the
messages still flow).

Membership: like `PeerTransport`, a `SimTransport` talks to the members of
its node's configuration (`set_peers`) and admits a message from a node it
does not list only if the node's own `accept_peer` predicate (the one the
runtime hands `PeerTransport`, set by the harness) admits it: a member it
has not heard of yet, which it then answers (a *learned* peer); a node whose
removal it knows is refused, so a removed node that keeps running is cut off
by every node that knows of its removal. `open_peers` lifts both filters
(everything is delivered and sent, whatever the configuration), for the
seeds that test the core alone against a removed node's messages.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dledger.messages import Message
from dledger.runtime.codec import CodecError, decode_batch, encode_batches

MAX_PAYLOAD = 4 * 1024 * 1024
MAX_FRAME = 64 * 1024 * 1024


@dataclass
class NetFaults:
    """Per-message fault rates and delay ranges (seconds of virtual time)."""

    delay: tuple[float, float] = (0.0002, 0.002)
    loss: float = 0.0
    duplicate: float = 0.0
    long_delay: float = 0.0
    long_delay_range: tuple[float, float] = (0.6, 2.0)


@dataclass
class _Endpoint:
    loop: asyncio.AbstractEventLoop
    deliver: Callable[[list[Message]], None]
    incarnation: int
    # Whether the node takes a message from this sender (its transport's
    # peer filter); None: from anyone.
    admits: Callable[[int], bool] | None = None


@dataclass
class _Link:
    last_at: float = 0.0
    epoch: int = 0


class SimNetwork:
    """Every link between the simulated nodes of one run."""

    def __init__(self, rng: random.Random, now: Callable[[], float]) -> None:
        self._rng = rng
        self._now = now
        self.faults = NetFaults()
        self.blocked: set[tuple[int, int]] = set()
        self._endpoints: dict[int, _Endpoint] = {}
        self._links: dict[tuple[int, int, str], _Link] = {}
        self._incarnations = 0
        self.counts: Counter[str] = Counter()
        # The connection model (module docstring); off: every peer connected.
        self.model_connections = False
        self._gone: set[int] = set()
        self._reset_until: dict[frozenset[int], float] = {}
        self._phantom_until: dict[tuple[int, int], float] = {}

    def attach(self, node_id: int, loop: asyncio.AbstractEventLoop,
               deliver: Callable[[list[Message]], None],
               admits: Callable[[int], bool] | None = None) -> int:
        self._incarnations += 1
        self._endpoints[node_id] = _Endpoint(loop, deliver, self._incarnations, admits)
        self._gone.discard(node_id)
        return self._incarnations

    def detach(self, node_id: int, incarnation: int) -> None:
        """The node closed its transport (it stopped or failed): its
        connections close."""
        endpoint = self._endpoints.get(node_id)
        if endpoint is not None and endpoint.incarnation == incarnation:
            del self._endpoints[node_id]
            self._gone.add(node_id)

    def detach_node(self, node_id: int, closes: bool = False) -> None:
        """The node's process is gone (crash): nothing reaches it any more;
        `closes`: its kernel closed its connections (a killed process), else
        they hang open (a machine without power)."""
        self._endpoints.pop(node_id, None)
        if closes:
            self._gone.add(node_id)

    def heal(self) -> None:
        """No more partitions, loss, duplication, long delays, connection
        resets or wrong reports of lost connections."""
        self.blocked.clear()
        self.faults = NetFaults()
        self._reset_until.clear()
        self._phantom_until.clear()

    # ---------------------------------------------------------- connections

    def peer_lost(self, observer: int, peer: int) -> bool:
        """Whether `observer` sees every connection with `peer` closed."""
        if not self.model_connections:
            return False
        now = self._now()
        if peer in self._gone and peer not in self._endpoints:
            return True
        if self._reset_until.get(frozenset((observer, peer)), 0.0) > now:
            return True
        return self._phantom_until.get((observer, peer), 0.0) > now

    def reset(self, a: int, b: int, seconds: float) -> None:
        """Every connection between `a` and `b` is reset and re-dialled for
        `seconds`: what was in flight is lost, and so is what is sent meanwhile."""
        self._reset_until[frozenset((a, b))] = self._now() + seconds
        for key, link in self._links.items():
            if {key[0], key[1]} == {a, b}:
                link.epoch += 1
                link.last_at = self._now()
        self.counts["resets_injected"] += 1

    def phantom(self, observer: int, peer: int, seconds: float) -> None:
        """`observer`'s transport says every connection with `peer` is closed
        for `seconds`, wrongly: the messages still flow."""
        self._phantom_until[(observer, peer)] = self._now() + seconds
        self.counts["phantoms_injected"] += 1

    def send(self, src: int, dst: int, channel: str, payload: bytes) -> None:
        if (src, dst) in self.blocked:
            self.counts["partitioned"] += 1
            return
        if self._reset_until and self._reset_until.get(frozenset((src, dst)), 0.0) > self._now():
            self.counts["reset_dropped"] += 1
            return
        faults, rng = self.faults, self._rng
        if faults.loss and rng.random() < faults.loss:
            self.counts["lost"] += 1
            return
        target = self._endpoints.get(dst)
        if target is None:
            self.counts["no_listener"] += 1
            return
        delay = rng.uniform(*faults.delay)
        if faults.long_delay and rng.random() < faults.long_delay:
            delay = rng.uniform(*faults.long_delay_range)
            self.counts["long_delay"] += 1
        link = self._links.setdefault((src, dst, channel), _Link())
        at = max(self._now() + delay, link.last_at)
        link.last_at = at
        copies = 1
        if faults.duplicate and rng.random() < faults.duplicate:
            copies = 2
            self.counts["duplicated"] += 1
        for _ in range(copies):
            target.loop.call_at(at, self._arrive, src, dst, channel, payload, link.epoch,
                                target.incarnation)
        self.counts["sent"] += 1

    def _arrive(self, src: int, dst: int, channel: str, payload: bytes, epoch: int,
                incarnation: int) -> None:
        target = self._endpoints.get(dst)
        link = self._links[(src, dst, channel)]
        if target is None or target.incarnation != incarnation or link.epoch != epoch:
            self.counts["dropped_in_flight"] += 1
            return
        if (src, dst) in self.blocked:
            self.counts["partitioned"] += 1
            return
        if target.admits is not None and not target.admits(src):
            # The real transport refuses the sender's connection.
            self.counts["refused_peer"] += 1
            return
        try:
            messages = decode_batch(payload, MAX_FRAME)
            for msg in messages:
                if msg.src != src or msg.dst != dst:
                    raise CodecError(f"message {msg.src}->{msg.dst} on link {src}->{dst}")
            target.deliver(messages)
        except CodecError:
            # The real transport closes the connection: what was in flight on
            # it is gone, and the sender re-dials.
            link.epoch += 1
            link.last_at = self._now()
            self.counts["connection_resets"] += 1
            return
        self.counts["delivered"] += 1


class SimTransport:
    """`dledger.runtime.node.Transport` over a `SimNetwork`."""

    def __init__(self, network: SimNetwork, node_id: int, loop: asyncio.AbstractEventLoop,
                 deliver: Callable[[list[Message]], None],
                 observe: Callable[[int, Sequence[Message]], None] | None = None,
                 extra: Callable[[int, Sequence[Message]], list[Message]] | None = None,
                 open_peers: bool = False, directory_id: int = 0) -> None:
        self._network = network
        self._observe = observe
        # Legal messages the node could have sent along with these (the
        # harness's stale appends); observed and sent like the node's own.
        self._extra = extra
        self._node_id = node_id
        self._loop = loop
        self._deliver = deliver
        self._incarnation = 0
        self.closed = False
        self.payloads = 0
        # The configuration's members (None: everyone, until the node says);
        # like the TCP transport, nothing goes to a node outside it but the
        # learned ones (see the module docstring).
        self._peers: frozenset[int] | None = None
        self._learned: set[int] = set()
        self._open = open_peers
        # `RaftGroupNode._accept_peer`, once the node is built (None: admit).
        self.accept_peer: Callable[[int], bool] | None = None
        # Stamped on every message sent, as `PeerTransport` does: the
        # snapshot transfer's messages leave under the node's directory too.
        self._stamp = directory_id or None
        self.unroutable = 0
        self.refused = 0

    async def start(self) -> tuple[str, int]:
        self._incarnation = self._network.attach(self._node_id, self._loop, self._deliver,
                                                 None if self._open else self.admits)
        return ("sim", self._node_id)

    def send(self, messages: Sequence[Message]) -> None:
        if self.closed or not self._incarnation:
            return
        if self._extra is not None:
            messages = [*messages, *self._extra(self._node_id, messages)]
        if self._observe is not None:
            self._observe(self._node_id, messages)
        links: dict[tuple[int, str], list[Message]] = {}
        for msg in messages:
            if not self._routable(msg.dst):
                self.unroutable += 1
                continue
            links.setdefault((msg.dst, msg.channel), []).append(msg)
        for (dst, channel), batch in links.items():
            for payload in encode_batches(batch, MAX_PAYLOAD, self._stamp):
                self.payloads += 1
                self._network.send(self._node_id, dst, channel, payload)

    async def close(self) -> None:
        self.closed = True
        self._network.detach(self._node_id, self._incarnation)

    def connected(self, peer: int) -> bool:
        """The simulated network has no connections: a member (or a learned
        peer) is reachable unless this transport is closed; partitions drop
        messages instead."""
        return (not self.closed and bool(self._incarnation)
                and (self._peers is None or peer in self._peers or peer in self._learned))

    def peer_lost(self, peer: int) -> bool:
        """Every connection with `peer` is closed (the connection model of
        `SimNetwork`; with it off, never)."""
        return self._network.peer_lost(self._node_id, peer)

    def set_peers(self, peers: Mapping[int, tuple[str, int]]) -> None:
        self._peers = frozenset(peers) - {self._node_id}
        # Learned peers stay while the predicate admits them.
        self._learned = {n for n in self._learned if n in self._peers or self._accepts(n)}

    def admits(self, src: int) -> bool:
        """Whether a message from `src` is taken (`PeerTransport`'s HELLO
        check); an admitted unlisted sender is answered from now on."""
        if self._peers is None or src in self._peers:
            return True
        if not self._accepts(src):
            self.refused += 1
            return False
        self._learned.add(src)
        return True

    def _accepts(self, node_id: int) -> bool:
        return self.accept_peer is None or self.accept_peer(node_id)

    def _routable(self, dst: int) -> bool:
        return self._open or self._peers is None or dst in self._peers or dst in self._learned

    def stats(self) -> dict[str, Any]:
        return {"payloads": self.payloads, "unroutable": self.unroutable,
                "refused": self.refused}
