"""LedgerMQ's Python client SDK: asyncio first, with a thin synchronous wrapper.

Shares only the wire format (`ledgermq.wire`, codes and errors) with the
servers; see docs/broker.md for the delivery guarantees.
"""

from ledgermq.client.allocate import allocate_averagely
from ledgermq.client.consumer import PullConsumer, PushConsumer
from ledgermq.client.model import (
    Message,
    MessageQueue,
    PullResult,
    ReceivedMessage,
    SendResult,
    credentials_from_env,
)
from ledgermq.client.producer import Producer
from ledgermq.client.routes import Cluster
from ledgermq.wire.auth import Credentials

__all__ = [
    "Cluster",
    "Credentials",
    "Message",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "ReceivedMessage",
    "SendResult",
    "allocate_averagely",
    "credentials_from_env",
]
