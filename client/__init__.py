"""LedgerMQ's Python client SDK: asyncio first, with a thin synchronous wrapper.

Shares only the wire format (`ledgermq.wire`, codes and errors) with the
servers; see docs/broker.md for the delivery guarantees.
"""

from client.allocate import allocate_averagely
from client.consumer import PullConsumer, PushConsumer
from client.model import Message, MessageQueue, PullResult, ReceivedMessage, SendResult
from client.producer import Producer
from client.routes import Cluster

__all__ = [
    "Cluster",
    "Message",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "ReceivedMessage",
    "SendResult",
    "allocate_averagely",
]
