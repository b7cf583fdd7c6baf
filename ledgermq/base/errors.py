"""Error codes shared by every LedgerMQ server and client, and their exceptions.

One enum, `ErrorCode`, numbers every failure a response can carry; the numbers
are part of the wire protocol (docs/protocol.md) and must never be reused. Each
code has an exception class so that callers can catch exactly what they handle
(`except NotLeaderError as e: retry(e.leader)`), and `error_from_response`
turns a status received off the wire back into that class.

Status 0 means success and is not an error code member, so that `if status:`
reads naturally.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, ClassVar

OK = 0


class ErrorCode(IntEnum):
    """Response status codes. Grouped by tens: protocol, data, availability."""

    # Connection / protocol level. The first three close the connection.
    MALFORMED_FRAME = 1
    FRAME_TOO_LARGE = 2
    UNSUPPORTED_VERSION = 3
    HANDSHAKE_REQUIRED = 4
    UNKNOWN_REQUEST = 5
    INVALID_REQUEST = 6
    # Authentication failed or is missing: the connection is closed after it.
    UNAUTHENTICATED = 7

    # Routing and data.
    NOT_LEADER = 10
    UNKNOWN_TOPIC = 11
    MESSAGE_TOO_LARGE = 12
    OFFSET_OUT_OF_RANGE = 13
    NO_PERMISSION = 14
    UNKNOWN_BROKER = 15
    # A pull below the queue's first retained offset: retention deleted those
    # messages. Body {"min_offset", "max_offset", "requested"}: continue there.
    OFFSET_MOVED = 16

    # Availability.
    TIMEOUT = 20
    SERVICE_UNAVAILABLE = 21
    DISK_FULL = 22
    OUTCOME_UNKNOWN = 23

    INTERNAL = 50


class LedgerMQError(Exception):
    """Base of every error that has a wire code.

    `message` is for humans; `data` is an optional machine-readable detail that
    travels in the response body (for NOT_LEADER: {"leader": "host:port"}).
    A status this client does not know (a newer server) still becomes a
    LedgerMQError whose `code` is the raw int.
    """

    default_code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(self, message: str, *, data: Any = None, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data
        self.code: int = self.default_code if code is None else code

    def __repr__(self) -> str:
        name = _code_name(self.code)
        return f"{type(self).__name__}({name}: {self.message!r})"

    def __str__(self) -> str:
        return f"{_code_name(self.code)}: {self.message}"


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"ERROR_{code}"


class MalformedFrameError(LedgerMQError):
    default_code = ErrorCode.MALFORMED_FRAME


class FrameTooLargeError(LedgerMQError):
    default_code = ErrorCode.FRAME_TOO_LARGE


class UnsupportedVersionError(LedgerMQError):
    default_code = ErrorCode.UNSUPPORTED_VERSION


class HandshakeRequiredError(LedgerMQError):
    default_code = ErrorCode.HANDSHAKE_REQUIRED


class UnknownRequestError(LedgerMQError):
    default_code = ErrorCode.UNKNOWN_REQUEST


class InvalidRequestError(LedgerMQError):
    default_code = ErrorCode.INVALID_REQUEST


class NotLeaderError(LedgerMQError):
    """The node is not its group's leader; `leader` is where to retry, if known."""

    default_code = ErrorCode.NOT_LEADER

    def __init__(
        self, message: str, *, leader: str | None = None, data: Any = None, code: int | None = None
    ) -> None:
        if data is None:
            data = {"leader": leader}
        elif leader is None and isinstance(data, dict):
            leader = data.get("leader") if isinstance(data.get("leader"), str) else None
        super().__init__(message, data=data, code=code)
        self.leader: str | None = leader


class UnknownTopicError(LedgerMQError):
    default_code = ErrorCode.UNKNOWN_TOPIC


class MessageTooLargeError(LedgerMQError):
    default_code = ErrorCode.MESSAGE_TOO_LARGE


class OffsetOutOfRangeError(LedgerMQError):
    default_code = ErrorCode.OFFSET_OUT_OF_RANGE


class OffsetMovedError(LedgerMQError):
    """The requested offset is below the oldest message the queue still holds
    (retention deleted the rest); `min_offset` is where to continue."""

    default_code = ErrorCode.OFFSET_MOVED

    @property
    def min_offset(self) -> int | None:
        value = self.data.get("min_offset") if isinstance(self.data, dict) else None
        return value if isinstance(value, int) else None

    @property
    def requested(self) -> int | None:
        value = self.data.get("requested") if isinstance(self.data, dict) else None
        return value if isinstance(value, int) else None


class NoPermissionError(LedgerMQError):
    default_code = ErrorCode.NO_PERMISSION


class UnauthenticatedError(LedgerMQError):
    """The peer did not prove who it is (no AUTH, unknown key, wrong proof)."""

    default_code = ErrorCode.UNAUTHENTICATED


class UnknownBrokerError(LedgerMQError):
    default_code = ErrorCode.UNKNOWN_BROKER


class RequestTimeoutError(LedgerMQError):
    default_code = ErrorCode.TIMEOUT


class ServiceUnavailableError(LedgerMQError):
    default_code = ErrorCode.SERVICE_UNAVAILABLE


class DiskFullError(LedgerMQError):
    """The broker refuses new messages: its disk is above `disk_hard_ratio`
    (broker/retention.py). Body {"usage_ratio", "hard_ratio", "path"}. A retry
    succeeds once retention has freed space."""

    default_code = ErrorCode.DISK_FULL


class OutcomeUnknownError(LedgerMQError):
    """A write was proposed but leadership changed before its fate was known:
    it may or may not be stored. Retry with the same producer id and sequence."""

    default_code = ErrorCode.OUTCOME_UNKNOWN


class InternalError(LedgerMQError):
    default_code = ErrorCode.INTERNAL


class ConnectionClosedError(ConnectionError):
    """The connection ended (by the peer, or locally) before a response arrived.

    Not a LedgerMQError: no server said anything, so whether a request that was
    in flight took effect is unknown. Reconnecting is the caller's business.
    """


_BY_CODE: dict[int, type[LedgerMQError]] = {
    cls.default_code: cls
    for cls in (
        MalformedFrameError,
        FrameTooLargeError,
        UnsupportedVersionError,
        HandshakeRequiredError,
        UnknownRequestError,
        InvalidRequestError,
        UnauthenticatedError,
        NotLeaderError,
        UnknownTopicError,
        MessageTooLargeError,
        OffsetOutOfRangeError,
        OffsetMovedError,
        NoPermissionError,
        UnknownBrokerError,
        RequestTimeoutError,
        ServiceUnavailableError,
        DiskFullError,
        OutcomeUnknownError,
        InternalError,
    )
}


def exception_class(code: int) -> type[LedgerMQError]:
    """The exception class for a status code (LedgerMQError for unknown codes)."""
    return _BY_CODE.get(code, LedgerMQError)


def error_from_response(code: int, message: str | None, data: Any = None) -> LedgerMQError:
    """Rebuild the typed exception a server reported with status `code`."""
    cls = exception_class(code)
    text = message or _code_name(code)
    return cls(text, data=data, code=code)
