"""Compact msgpack encoding of the Raft messages for the peer transport.

Each message is one msgpack array whose first element is a type code; a frame
payload is several such arrays back to back (so a batch can be cut into
frames of bounded size without re-encoding). Entry bodies stay `bytes`
(msgpack bin), and the entries of an `AppendRequest` are contiguous from
`prev_index + 1`, so their indexes are not sent at all. Every message starts
with the same five fields: type, sender, addressee, term and the sender's
data-directory id (`dir`, `dledger.membership`: 0 = unknown):

    VoteRequest        [1, src, dst, term, dir, last_index, last_term, pre_vote, transfer]
    VoteResponse       [2, src, dst, term, dir, granted, pre_vote]
    Heartbeat          [3, src, dst, term, dir, commit]
    HeartbeatResponse  [4, src, dst, term, dir] or [4, src, dst, term, dir, last_index]
    TimeoutNow         [5, src, dst, term, dir]
    AppendRequest      [6, src, dst, term, dir, prev_index, prev_term, commit,
                        [term, kind, position, data, term, kind, position, data, ...]]
    AppendResponse     [7, src, dst, term, dir, success, index, hint_index, hint_term]
    SnapshotOffer      [8, src, dst, term, dir, transfer, index, snap_term, end_position,
                        first_index, state_crc, [name, size, name, size, ...]]
    SnapshotChunk      [9, src, dst, term, dir, transfer, index, file, offset, data, crc,
                        last]
    SnapshotAck        [10, src, dst, term, dir, transfer, index, offset, ok, reason]
    InstallSnapshot    [11, src, dst, term, dir, index, snap_term, end_position,
                        membership]

`membership` is `dledger.membership.encode`'s canonical JSON (bin) of the
configuration in effect at the snapshot's index, or nil (the bootstrap
configuration). A CONFIG entry (`EntryKind.CONFIG`) travels like any entry;
its data is checked to decode as a configuration, like the membership of an
InstallSnapshot, so a forged or broken configuration never reaches the core.

This layout is version 2 of the peer protocol (`HELLO_VERSION`); version 1
had no `dir` and no `membership`. The HELLO names the version and a node
refuses a peer speaking another one in the handshake (`PeerVersionError`),
so the nodes of a group must run one release: docs/protocol.md, "Raft peer
port", says what that means for a rolling upgrade.

SnapshotOffer, SnapshotChunk and SnapshotAck are the runtime's snapshot
transfer (`snapshot_transfer.py`), never stepped into the core. A chunk is
checked here as far as it can be without context: its file name is the
state file or a 20-digit segment name (nothing else can reach the staging
directory), its data is non-empty, at most `CHUNK_BYTES_MAX` bytes and
matches its crc32c; a forged or corrupted chunk is a `CodecError` like any
other malformed message.

The connection handshake (first frame of every peer connection) is a msgpack
map, see `encode_hello` / `decode_hello`. In a group with a cluster secret
the HELLO also carries the connector's nonce, the acceptor answers with a
CHALLENGE map (its challenge and its proof) and the connector sends a PROOF
map; `transport.py` runs that exchange (docs/raft.md, "Peer authentication").

Decoding trusts nothing: every field is type- and range-checked and any
problem raises `CodecError`, which makes the transport close that connection.
Terms, indexes, commit indexes and positions must be at most 2**63 - 1 and an
entry kind must fit the entry header's byte: the CommitLog stores them as u64
and u8, and a node increments a term it adopted, so a term of 2**64 - 1 taken
from the wire would overflow on the next election (the node could then neither
persist nor send its term, and every peer that heard it would wedge too).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NotRequired, TypedDict

import msgpack
from crc32c import crc32c

from dledger.entry import Entry, EntryKind
from dledger.membership import Membership, MembershipError
from dledger.membership import decode as decode_membership
from dledger.membership import encode as encode_membership
from dledger.messages import (
    AppendRequest,
    AppendResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from dledger.runtime.snapshot_transfer import (
    CHUNK_BYTES_MAX,
    MANIFEST_FILES_MAX,
    REASON_MAX,
    SnapshotAck,
    SnapshotChunk,
    SnapshotOffer,
    valid_file_name,
)

HELLO_MAGIC = "ledgermq-raft"
# 2: every message carries the sender's directory id, InstallSnapshot the
# membership (issue 17, membership changes). Version 1 peers are refused.
HELLO_VERSION = 2
CHANNELS = ("control", "replication")

_T_VOTE_REQ = 1
_T_VOTE_RESP = 2
_T_HEARTBEAT = 3
_T_HEARTBEAT_RESP = 4
_T_TIMEOUT_NOW = 5
_T_APPEND_REQ = 6
_T_APPEND_RESP = 7
_T_SNAPSHOT_OFFER = 8
_T_SNAPSHOT_CHUNK = 9
_T_SNAPSHOT_ACK = 10
_T_INSTALL_SNAPSHOT = 11

_MAX_U64 = 2**64 - 1
_MAX_U32 = 2**32 - 1
# Largest term / index / position accepted off the wire (see the module doc):
# the i64 range, which leaves 2**63 increments of headroom below u64 overflow.
MAX_TERM_OR_INDEX = 2**63 - 1
_MAX_KIND = 0xFF
_KIND_CONFIG = int(EntryKind.CONFIG)  # a plain int: compared once per entry decoded
# Decoder limits: a batch carries no strings and no maps, and its longest
# array is an AppendRequest's flat entries (4 elements per entry); the
# handshake frame is a small map of short strings.
_BATCH_STR_MAX = 1024
_BATCH_ARRAY_MAX = 1 << 24
HELLO_BYTES_MAX = 4096
_HELLO_MAP_MAX = 16
# The handshake's random values and HMAC-SHA256 proofs (ledgermq.wire.auth).
NONCE_BYTES = 16
PROOF_BYTES = 32
# The largest configuration accepted off the wire (InstallSnapshot or CONFIG
# entry): the bound the snapshot meta puts on it (commitlog/snapshot.py).
MEMBERSHIP_BYTES_MAX = 1 << 20
# A member's address ("host:port") is at most this long (dledger.membership).
ADDRESS_CHARS_MAX = 255


class CodecError(ValueError):
    """A peer sent bytes that are not a valid message batch or handshake."""


class PeerVersionError(CodecError):
    """A HELLO of another peer protocol version: a node of another release."""

    def __init__(self, version: object, src: object) -> None:
        self.version = version
        self.src = src if type(src) is int else None
        who = f"node {self.src}" if self.src is not None else "the peer"
        super().__init__(
            f"{who} speaks Raft peer protocol version {version!r:.20}, this node speaks "
            f"{HELLO_VERSION}: every node of a group must run the same LedgerMQ release "
            "(version 2 added membership changes: directory ids on every message, the "
            "configuration in snapshots); finish upgrading the group")


class PeerHello(TypedDict):
    """The handshake map, in wire order: who connects to whom, in which group, on which channel."""

    hello: str
    version: int
    group: str
    src: int
    dst: int
    channel: str
    # Present when the connector holds the cluster secret: it asks the
    # acceptor to prove the secret over this nonce (and will prove it in turn).
    nonce: NotRequired[bytes]
    # The connector's own Raft address ("host:port"): where the acceptor can
    # answer a node it has no address for (a leader added to the group after
    # the acceptor's newest configuration; see transport.py, "Membership").
    addr: NotRequired[str]


def peer_claim(group: str, src: int, dst: int, channel: str) -> str:
    """What both proofs of a peer handshake bind: a proof made for one group,
    direction or channel never verifies for another."""
    return f"raft:{group}/{src}->{dst}/{channel}"


# ------------------------------------------------------------------ encoding


def _encode_one(msg: Message, d: int) -> list[Any]:
    """`msg` as an array; `d` is the directory id it is sent under."""
    # Most frequent types first: this runs once per message sent.
    match msg:
        case AppendRequest():
            flat: list[Any] = []
            for e in msg.entries:
                flat += (e.term, e.kind, e.position, e.data)
            return [_T_APPEND_REQ, msg.src, msg.dst, msg.term, d, msg.prev_index,
                    msg.prev_term, msg.commit, flat]
        case AppendResponse():
            return [_T_APPEND_RESP, msg.src, msg.dst, msg.term, d, msg.success, msg.index,
                    msg.hint_index, msg.hint_term]
        case Heartbeat():
            return [_T_HEARTBEAT, msg.src, msg.dst, msg.term, d, msg.commit]
        case HeartbeatResponse() if msg.last_index < 0:
            return [_T_HEARTBEAT_RESP, msg.src, msg.dst, msg.term, d]
        case HeartbeatResponse():
            return [_T_HEARTBEAT_RESP, msg.src, msg.dst, msg.term, d, msg.last_index]
        case VoteRequest():
            return [_T_VOTE_REQ, msg.src, msg.dst, msg.term, d, msg.last_index, msg.last_term,
                    msg.pre_vote, msg.transfer]
        case VoteResponse():
            return [_T_VOTE_RESP, msg.src, msg.dst, msg.term, d, msg.granted, msg.pre_vote]
        case TimeoutNow():
            return [_T_TIMEOUT_NOW, msg.src, msg.dst, msg.term, d]
        case InstallSnapshot():
            membership = None if msg.membership is None else encode_membership(msg.membership)
            return [_T_INSTALL_SNAPSHOT, msg.src, msg.dst, msg.term, d, msg.index,
                    msg.snap_term, msg.end_position, membership]
        case SnapshotChunk():
            return [_T_SNAPSHOT_CHUNK, msg.src, msg.dst, msg.term, d, msg.transfer, msg.index,
                    msg.file, msg.offset, msg.data, msg.crc, msg.last]
        case SnapshotAck():
            return [_T_SNAPSHOT_ACK, msg.src, msg.dst, msg.term, d, msg.transfer, msg.index,
                    msg.offset, msg.ok, msg.reason]
        case SnapshotOffer():
            files: list[Any] = []
            for name, size in msg.files:
                files += (name, size)
            return [_T_SNAPSHOT_OFFER, msg.src, msg.dst, msg.term, d, msg.transfer, msg.index,
                    msg.snap_term, msg.end_position, msg.first_index, msg.state_crc, files]
    raise TypeError(f"cannot encode {type(msg).__name__}")


# One Packer for every message: `msgpack.packb` builds a Packer per call.
# Its `pack` runs no Python code, so it holds the GIL throughout (no thread
# can interleave) and resets itself after an error.
_PACK = msgpack.Packer(use_bin_type=True).pack


def _packb(obj: object) -> bytes:
    packed: bytes = _PACK(obj)
    return packed


def encode_message(msg: Message, directory_id: int | None = None) -> bytes:
    """One message as a msgpack array, sent under `directory_id` (None: the
    message's own `directory_id`)."""
    return _packb(_encode_one(msg, msg.directory_id if directory_id is None else directory_id))


def encode_batches(messages: Iterable[Message], max_payload_bytes: int,
                   directory_id: int | None = None) -> list[bytes]:
    """Frame payloads carrying `messages` in order, each at most about
    `max_payload_bytes` (a single larger message gets a payload of its own).
    With `directory_id` every message is sent under it, whatever its own
    field says (the transport stamps its node's id, see transport.py)."""
    payloads: list[bytes] = []
    parts: list[bytes] = []
    size = 0
    for msg in messages:
        raw = encode_message(msg, directory_id)
        if parts and size + len(raw) > max_payload_bytes:
            payloads.append(b"".join(parts))
            parts, size = [], 0
        parts.append(raw)
        size += len(raw)
    if parts:
        payloads.append(b"".join(parts))
    return payloads


def encode_hello(group: str, src: int, dst: int, channel: str,
                 nonce: bytes | None = None, addr: str | None = None) -> bytes:
    """The connector's first frame; with `nonce` it asks for authentication,
    with `addr` ("host:port") it says where it listens."""
    hello = PeerHello(hello=HELLO_MAGIC, version=HELLO_VERSION, group=group, src=src,
                      dst=dst, channel=channel)
    if nonce is not None:
        hello["nonce"] = nonce
    if addr is not None:
        hello["addr"] = addr
    return _packb(hello)


def format_address(address: tuple[str, int]) -> str:
    """(host, port) as "host:port" ("[v6]:port" for an IPv6 host)."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str) -> tuple[str, int]:
    """"host:port" (or "[v6]:port") as (host, port); `CodecError` if it is not one."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if (not sep or not host or len(text) > ADDRESS_CHARS_MAX
            or not (port.isascii() and port.isdigit())
            or not 0 < int(port) < 65536 or any(c in host for c in "[] /")):
        raise CodecError(f"address {text!r:.80} is not host:port")
    return host, int(port)


def encode_challenge(challenge: bytes, proof: bytes) -> bytes:
    """The acceptor's answer to an authenticating HELLO: its fresh challenge
    and its own proof over (challenge, the connector's nonce, the claim)."""
    return _packb({"challenge": challenge, "proof": proof})


def encode_proof(proof: bytes) -> bytes:
    """The connector's proof over (the acceptor's challenge, its nonce, the claim)."""
    return _packb({"proof": proof})


# ------------------------------------------------------------------ decoding


def _uint(value: Any, what: str) -> int:
    # bool is an int subclass; a True where a number belongs is a broken peer.
    if type(value) is not int or not 0 <= value <= _MAX_U64:
        raise CodecError(f"{what} must be an unsigned integer, got {type(value).__name__}")
    return value


def _u63(value: Any, what: str) -> int:
    """A term, index, commit index or position: unsigned and within the i64 range."""
    if type(value) is not int or not 0 <= value <= MAX_TERM_OR_INDEX:
        raise CodecError(f"{what} must be an integer in [0, 2**63 - 1], got "
                         f"{type(value).__name__}")
    return value


def _u63s(*values: Any) -> bool:
    """Whether every value is an integer in [0, 2**63 - 1]: one call for the
    fields of the frequent messages (appends and their answers), whose
    per-field checks run only when this fails, to name the field (or to
    accept a node id above 2**63, which they allow)."""
    for value in values:
        if type(value) is not int or not 0 <= value <= MAX_TERM_OR_INDEX:
            return False
    return True


def _u32(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_U32:
        raise CodecError(f"{what} must be an integer in [0, 2**32 - 1]")
    return value


def _file_name(value: Any) -> str:
    if type(value) is not str or not valid_file_name(value):
        raise CodecError(f"snapshot file name {value!r:.60} is neither the state nor a segment")
    return value


def _kind(value: Any) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_KIND:
        raise CodecError(f"entry kind must be an integer in [0, 255], got {value!r:.40}")
    return value


def _membership(value: Any, what: str) -> Membership:
    """A configuration off the wire: bin of at most MEMBERSHIP_BYTES_MAX bytes
    that `dledger.membership.decode` accepts."""
    if type(value) is not bytes or len(value) > MEMBERSHIP_BYTES_MAX:
        raise CodecError(f"{what} must be at most {MEMBERSHIP_BYTES_MAX} bytes of binary")
    try:
        return decode_membership(value)
    except (MembershipError, RecursionError) as exc:
        # RecursionError: JSON nested deeper than the parser goes.
        raise CodecError(f"{what} is not a valid configuration: {exc!s:.200}") from None


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise CodecError(f"{what} must be a boolean, got {type(value).__name__}")
    return value


def _fields(obj: list[Any], n: int, name: str) -> None:
    if len(obj) != n:
        raise CodecError(f"{name} has {len(obj)} fields, expected {n}")


def _decode_one(obj: Any) -> Message:
    if type(obj) is not list or not obj:
        raise CodecError(f"message must be a non-empty array, got {type(obj).__name__}")
    t = obj[0]
    if t == _T_APPEND_REQ and type(t) is int:
        _fields(obj, 9, "AppendRequest")
        _, src, dst, term, d, prev_index, prev_term, commit, flat = obj
        if not _u63s(src, dst, term, d, prev_index, prev_term, commit):
            src, dst, term = _uint(src, "src"), _uint(dst, "dst"), _u63(term, "term")
            d = _u63(d, "directory_id")
            prev_index, prev_term = _u63(prev_index, "prev_index"), _u63(prev_term, "prev_term")
            commit = _u63(commit, "commit")
        if type(flat) is not list or len(flat) % 4:
            raise CodecError("AppendRequest entries must be an array of 4-tuples")
        if prev_index + len(flat) // 4 > MAX_TERM_OR_INDEX:
            raise CodecError("AppendRequest entries would pass index 2**63 - 1")
        entries = []
        index = prev_index
        for k in range(0, len(flat), 4):
            e_term, e_kind, position, data = flat[k : k + 4]
            if type(data) is not bytes:
                raise CodecError("entry data must be binary")
            index += 1
            if not (_u63s(e_term, position) and type(e_kind) is int and 0 <= e_kind <= _MAX_KIND):
                e_kind = _kind(e_kind)
                e_term, position = _u63(e_term, "entry term"), _u63(position, "entry position")
            if e_kind == _KIND_CONFIG:
                _membership(data, f"CONFIG entry {index}")
            entries.append(Entry(index, e_term, e_kind, data, position))
        return AppendRequest(src, dst, term, prev_index, prev_term, tuple(entries), commit,
                             directory_id=d)
    if type(t) is not int:
        raise CodecError("message type must be an integer")
    if t == _T_APPEND_RESP:
        _fields(obj, 9, "AppendResponse")
        _, src, dst, term, d, success, index, hint_index, hint_term = obj
        if not (_u63s(src, dst, term, d, index, hint_index, hint_term)
                and type(success) is bool):
            src, dst, term = _uint(src, "src"), _uint(dst, "dst"), _u63(term, "term")
            success, index = _bool(success, "success"), _u63(index, "index")
            hint_index, hint_term = _u63(hint_index, "hint_index"), _u63(hint_term, "hint_term")
            d = _u63(d, "directory_id")
        return AppendResponse(src, dst, term, success, index, hint_index, hint_term,
                              directory_id=d)
    if t == _T_HEARTBEAT:
        _fields(obj, 6, "Heartbeat")
        return Heartbeat(_uint(obj[1], "src"), _uint(obj[2], "dst"), _u63(obj[3], "term"),
                         _u63(obj[5], "commit"), directory_id=_u63(obj[4], "directory_id"))
    if t == _T_HEARTBEAT_RESP:
        if len(obj) == 6:  # with the follower's log end (it lost entries)
            return HeartbeatResponse(_uint(obj[1], "src"), _uint(obj[2], "dst"),
                                     _u63(obj[3], "term"), _u63(obj[5], "last_index"),
                                     directory_id=_u63(obj[4], "directory_id"))
        _fields(obj, 5, "HeartbeatResponse")
        return HeartbeatResponse(_uint(obj[1], "src"), _uint(obj[2], "dst"), _u63(obj[3], "term"),
                                 directory_id=_u63(obj[4], "directory_id"))
    if t == _T_VOTE_REQ:
        _fields(obj, 9, "VoteRequest")
        return VoteRequest(_uint(obj[1], "src"), _uint(obj[2], "dst"), _u63(obj[3], "term"),
                           _u63(obj[5], "last_index"), _u63(obj[6], "last_term"),
                           _bool(obj[7], "pre_vote"), _bool(obj[8], "transfer"),
                           directory_id=_u63(obj[4], "directory_id"))
    if t == _T_VOTE_RESP:
        _fields(obj, 7, "VoteResponse")
        return VoteResponse(_uint(obj[1], "src"), _uint(obj[2], "dst"), _u63(obj[3], "term"),
                            _bool(obj[5], "granted"), _bool(obj[6], "pre_vote"),
                            directory_id=_u63(obj[4], "directory_id"))
    if t == _T_TIMEOUT_NOW:
        _fields(obj, 5, "TimeoutNow")
        return TimeoutNow(_uint(obj[1], "src"), _uint(obj[2], "dst"), _u63(obj[3], "term"),
                          directory_id=_u63(obj[4], "directory_id"))
    if t == _T_INSTALL_SNAPSHOT:
        _fields(obj, 9, "InstallSnapshot")
        raw = obj[8]
        membership = None if raw is None else _membership(raw, "InstallSnapshot membership")
        return InstallSnapshot(_uint(obj[1], "src"), _uint(obj[2], "dst"), _u63(obj[3], "term"),
                               _u63(obj[5], "index"), _u63(obj[6], "snap_term"),
                               _u63(obj[7], "end_position"), membership,
                               directory_id=_u63(obj[4], "directory_id"))
    if t in (_T_SNAPSHOT_OFFER, _T_SNAPSHOT_CHUNK, _T_SNAPSHOT_ACK):
        return _decode_transfer(t, obj)
    raise CodecError(f"unknown message type {t}")


_TRANSFER_FIELDS = {_T_SNAPSHOT_OFFER: (12, "SnapshotOffer"),
                    _T_SNAPSHOT_CHUNK: (12, "SnapshotChunk"),
                    _T_SNAPSHOT_ACK: (10, "SnapshotAck")}


def _decode_transfer(t: int, obj: list[Any]) -> Message:
    _fields(obj, *_TRANSFER_FIELDS[t])
    src, dst = _uint(obj[1], "src"), _uint(obj[2], "dst")
    d = _u63(obj[4], "directory_id")
    # The fields after the common five.
    f = obj[5:]
    if t == _T_SNAPSHOT_CHUNK:
        file, offset, data = _file_name(f[2]), _u63(f[3], "chunk offset"), f[4]
        if type(data) is not bytes or not 0 < len(data) <= CHUNK_BYTES_MAX:
            raise CodecError(f"chunk data must be 1..{CHUNK_BYTES_MAX} bytes")
        if offset + len(data) > MAX_TERM_OR_INDEX:
            raise CodecError("chunk would pass byte 2**63 - 1")
        crc = _u32(f[5], "chunk crc")
        if crc32c(data) != crc:
            raise CodecError(f"chunk of {file} at {offset}: CRC mismatch")
        return SnapshotChunk(src, dst, _u63(obj[3], "term"), _uint(f[0], "transfer"),
                             _u63(f[1], "index"), file, offset, data, crc,
                             _bool(f[6], "last"), directory_id=d)
    if t == _T_SNAPSHOT_ACK:
        ok, reason = _bool(f[3], "ok"), f[4]
        if type(reason) is not str or len(reason) > REASON_MAX or (ok and reason):
            raise CodecError("ack reason must be a short string, empty when ok")
        return SnapshotAck(src, dst, _u63(obj[3], "term"), _uint(f[0], "transfer"),
                           _u63(f[1], "index"), _u63(f[2], "ack offset"), ok, reason,
                           directory_id=d)
    flat = f[6]
    if type(flat) is not list or len(flat) % 2 or len(flat) > 2 * MANIFEST_FILES_MAX:
        raise CodecError(f"offer files must be at most {MANIFEST_FILES_MAX} (name, size) pairs")
    files = []
    total = 0
    for k in range(0, len(flat), 2):
        size = _u63(flat[k + 1], "file size")
        total += size
        files.append((_file_name(flat[k]), size))
    if total > MAX_TERM_OR_INDEX or len({name for name, _ in files}) != len(files):
        raise CodecError("offer files must be distinct and total below 2**63")
    return SnapshotOffer(src, dst, _u63(obj[3], "term"), _uint(f[0], "transfer"),
                         _u63(f[1], "index"), _u63(f[2], "snap_term"),
                         _u63(f[3], "end_position"), _u63(f[4], "first_index"),
                         _u32(f[5], "state_crc"), tuple(files), directory_id=d)


def decode_batch(payload: bytes, max_bin_len: int) -> list[Message]:
    """All messages of one frame payload; `CodecError` if any byte is wrong."""
    out: list[Message] = []
    rest = payload
    if payload:
        # Most frames carry one message (an append, its answer): decoded
        # without building an Unpacker. After the first of several, ExtraData
        # hands over that one and the bytes left, which the Unpacker below
        # decodes under the same limits.
        try:
            obj = msgpack.unpackb(payload, raw=False, max_bin_len=max_bin_len,
                                  max_str_len=_BATCH_STR_MAX, max_array_len=_BATCH_ARRAY_MAX,
                                  max_map_len=0)
        except msgpack.ExtraData as extra:
            out.append(_decoded(extra.unpacked))
            rest = extra.extra
        except Exception as exc:  # msgpack raises several unrelated types on bad input
            raise _not_msgpack(exc) from None
        else:
            return [_decoded(obj)]
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(rest), 1),
                                max_bin_len=max_bin_len, max_str_len=_BATCH_STR_MAX,
                                max_array_len=_BATCH_ARRAY_MAX, max_map_len=0)
    unpacker.feed(rest)
    end = 0  # where the last whole message ends
    while True:
        try:
            obj = unpacker.unpack()
        except msgpack.OutOfData:
            break
        except Exception as exc:
            raise _not_msgpack(exc) from None
        end = unpacker.tell()
        out.append(_decoded(obj))
    if end != len(rest):
        # Iterating an Unpacker stops at an incomplete message as if waiting
        # for more bytes; a frame holds whole messages only.
        raise CodecError(f"payload ends inside a message ({len(rest) - end} bytes left over)")
    if not out:
        raise CodecError("empty message batch")
    return out


def _decoded(obj: Any) -> Message:
    """`_decode_one`, any other error than its own a CodecError too."""
    try:
        return _decode_one(obj)
    except CodecError:
        raise
    except Exception as exc:
        raise _not_msgpack(exc) from None


def _not_msgpack(exc: Exception) -> CodecError:
    return CodecError(f"payload is not valid msgpack: {type(exc).__name__}: {exc}")


def _handshake_map(payload: bytes) -> dict[Any, Any]:
    try:
        obj = msgpack.unpackb(payload, raw=False, max_str_len=HELLO_BYTES_MAX,
                              max_bin_len=PROOF_BYTES, max_array_len=0,
                              max_map_len=_HELLO_MAP_MAX)
    except Exception as exc:
        raise CodecError(f"handshake is not valid msgpack: {type(exc).__name__}") from None
    if type(obj) is not dict:
        raise CodecError("handshake frame must be a map")
    return obj


def _binary(obj: dict[Any, Any], key: str, size: int) -> bytes:
    value = obj.get(key)
    if type(value) is not bytes or len(value) != size:
        raise CodecError(f"handshake {key} must be {size} bytes")
    return value


def decode_challenge(payload: bytes) -> tuple[bytes, bytes]:
    """(challenge, proof) of the acceptor's CHALLENGE frame."""
    obj = _handshake_map(payload)
    return _binary(obj, "challenge", NONCE_BYTES), _binary(obj, "proof", PROOF_BYTES)


def decode_proof(payload: bytes) -> bytes:
    """The proof of the connector's PROOF frame."""
    return _binary(_handshake_map(payload), "proof", PROOF_BYTES)


def decode_hello(payload: bytes) -> PeerHello:
    """The handshake map, shape-checked (group str, src/dst ints, known channel,
    a 16-byte nonce and a "host:port" addr when present); `PeerVersionError`
    for another version."""
    obj = _handshake_map(payload)
    if obj.get("hello") != HELLO_MAGIC:
        raise CodecError("not a LedgerMQ Raft peer handshake")
    version = obj.get("version")
    if type(version) is not int or version != HELLO_VERSION:
        raise PeerVersionError(version, obj.get("src"))
    group, channel = obj.get("group"), obj.get("channel")
    if type(group) is not str:
        raise CodecError("handshake group must be a string")
    src = _uint(obj.get("src"), "handshake src")
    dst = _uint(obj.get("dst"), "handshake dst")
    if channel not in CHANNELS:
        raise CodecError(f"unknown channel {channel!r}")
    hello = PeerHello(hello=HELLO_MAGIC, version=HELLO_VERSION, group=group, src=src, dst=dst,
                      channel=channel)
    if "nonce" in obj:
        hello["nonce"] = _binary(obj, "nonce", NONCE_BYTES)
    if "addr" in obj:
        addr = obj["addr"]
        if type(addr) is not str:
            raise CodecError("handshake addr must be a string")
        parse_address(addr)
        hello["addr"] = addr
    return hello
