"""LedgerMQ wire protocol: framing, messages, handshake, and the asyncio RPC layer.

`codec` is pure (bytes in, bytes out) and is what tests fuzz; `streams` moves
frames over asyncio streams; `rpc` and `rpc_client` are the generic server and
client every LedgerMQ process uses. The layout is specified in docs/protocol.md.
"""

from ledgermq.wire.codec import (
    CONNECTION_ERROR_ID,
    DEFAULT_COMPRESS_THRESHOLD,
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ZSTD,
    HEADER_SIZE,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    FrameDecoder,
    HelloBody,
    HelloReply,
    Request,
    RequestMap,
    Response,
    ResponseMap,
    decode_frame,
    decode_header,
    decode_payload,
    decode_request,
    decode_response,
    encode_frame,
    encode_frames,
    encode_request,
    encode_response,
    error_response,
    hello_body,
)
from ledgermq.wire.rpc import ROLES, Connection, Handler, RequestObserver, RpcServer
from ledgermq.wire.rpc_client import RpcClient
from ledgermq.wire.streams import FrameWriter, read_frame, write_frames

__all__ = [
    "CONNECTION_ERROR_ID",
    "DEFAULT_COMPRESS_THRESHOLD",
    "DEFAULT_MAX_FRAME_BYTES",
    "FLAG_ZSTD",
    "HEADER_SIZE",
    "PROTOCOL_VERSION",
    "ROLES",
    "SUPPORTED_VERSIONS",
    "Connection",
    "FrameDecoder",
    "FrameWriter",
    "Handler",
    "HelloBody",
    "HelloReply",
    "Request",
    "RequestMap",
    "RequestObserver",
    "Response",
    "ResponseMap",
    "RpcClient",
    "RpcServer",
    "decode_frame",
    "decode_header",
    "decode_payload",
    "decode_request",
    "decode_response",
    "encode_frame",
    "encode_frames",
    "encode_request",
    "encode_response",
    "error_response",
    "hello_body",
    "read_frame",
    "write_frames",
]
