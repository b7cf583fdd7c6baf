"""What the broker's client handlers, admin app and metrics read of a running broker.

`BrokerView` is a read-only `Protocol` that `broker.server.Broker` satisfies:
`handlers`, `admin_http` and `metrics` depend on it instead of on the server
module, which builds them (importing it back would be a cycle).

The send path's types live here too, so it can be followed by reading them:
a send request becomes a `broker.codec.Records` submitted to `sends` (a
`GroupCommitter`), which proposes one MESSAGES entry per batch through the
runtime (`runtime.RaftRuntime.propose`, returning the appended
`commitlog.Entry`) and answers each request with a `SendAck`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from consumequeue import ConsumeQueueStore
from dledger.runtime.node import NodeObserver
from ledgermq.broker.codec import Records
from ledgermq.broker.config import BrokerConfig
from ledgermq.broker.group_commit import GroupCommitter
from ledgermq.broker.keys import BrokerSecurity
from ledgermq.broker.longpoll import LongPoll
from ledgermq.broker.members import Membership
from ledgermq.broker.queue_repair import QueueRepairs
from ledgermq.broker.retention import Retention
from ledgermq.broker.runtime import RaftRuntime
from ledgermq.broker.state import AppliedRecords, BrokerState, Stored
from ledgermq.wire import RpcServer
from ledgermq.wire.auth import KeyStore

ControlOp = dict[str, Any]  # one control operation (broker.control builds them)


class SendAck(NamedTuple):
    """What a send request gets back from group commit (a tuple: one per
    request on the per-message path)."""

    first: int  # CommitLog position of the request's first record
    # Where every record of the request's entry went (the request's own are
    # `record`, `record + 1`, ...), or None with replicate=async (the queue
    # offsets are assigned at commit, after the answer).
    stored: AppliedRecords | None
    record: int = 0

    def location(self, k: int) -> Stored:
        """Where the request's k'th record went (`stored` is not None)."""
        assert self.stored is not None
        return self.stored.stored(self.record + k)


class BrokerObserver(NodeObserver, Protocol):
    """The runtime's observer plus the broker's send path (metrics implement it)."""

    def send_batch(self, messages: int) -> None:
        """A group-commit send batch of `messages` messages goes out."""


class _IgnoreAll:
    def synced(self, seconds: float, entries: int) -> None:
        pass

    def appended(self, seconds: float, entries: int) -> None:
        pass

    def acked(self, seconds: float) -> None:
        pass

    def send_batch(self, messages: int) -> None:
        pass


NO_BROKER_OBSERVER: BrokerObserver = _IgnoreAll()


class BrokerView(Protocol):
    """A started broker, as its handlers, admin app and metrics see it."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def state(self) -> BrokerState:
        """The replicated state machine (topics, offsets, producers)."""

    @property
    def node(self) -> RaftRuntime:
        """The Raft runtime (raises before `start`)."""

    @property
    def cq(self) -> ConsumeQueueStore:
        """The ConsumeQueues (raises before `start`)."""

    @property
    def sends(self) -> GroupCommitter[Records, SendAck] | None: ...

    @property
    def controls(self) -> GroupCommitter[ControlOp, int] | None:
        """Control operations; each resolves with its entry's index, once applied."""

    @property
    def entry_limit(self) -> int:
        """Largest entry the log takes, in bytes."""

    @property
    def longpoll(self) -> LongPoll: ...

    @property
    def queue_repairs(self) -> QueueRepairs:
        """Rebuilds of ConsumeQueues that reads found damaged."""

    @property
    def retention(self) -> Retention | None:
        """Retention and the disk watermarks (None before `start`)."""

    @property
    def members(self) -> Membership: ...

    @property
    def rpc(self) -> RpcServer | None: ...

    @property
    def security(self) -> BrokerSecurity:
        """What it proves membership with and verifies its peers by (the cluster
        key, the cluster CA), and its keys."""

    @property
    def keystore(self) -> KeyStore | None:
        """Whose signatures the admin app accepts; None: authentication is off."""

    @property
    def advertised(self) -> str:
        """The client address this node gives out."""

    def writable(self) -> bool:
        """This node is the ready leader: a write may go ahead at once."""

    def require_writable(self) -> None:
        """Raise unless `writable()`, saying why."""

    async def wait_writable(self) -> None:
        """`require_writable`, holding the write through an election or until
        this node's first entry is applied (up to `write_hold_ms`)."""

    def leader_client_address(self) -> str | None: ...

    def status(self) -> dict[str, Any]:
        """The BROKER_STATUS answer (JSON/msgpack-ready)."""
