"""Forged Raft traffic, as an attacker on the network writes it: well-encoded
peer handshakes and messages for a group's Raft port (dledger/runtime/codec.py).
Shared by tests/dledger/runtime/test_peer_auth.py (in-process nodes) and
tests/security/test_attacks.py (broker processes)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl

import commitlog
from dledger.entry import Entry
from dledger.messages import AppendRequest, Message, VoteRequest
from dledger.runtime.codec import encode_hello, encode_message, encode_proof
from ledgermq.wire.codec import encode_frame
from ledgermq.wire.streams import read_frame

FORGED = b"FORGED-BY-ATTACKER"


def forged_append(src: int, dst: int, term: int, prev_index: int, prev_term: int,
                  position: int) -> AppendRequest:
    """What follower `dst` would take from its leader `src` at `term`: a
    FORGED entry after (`prev_index`, `prev_term`), stored at `position`,
    with a commit index covering it."""
    entry = Entry(prev_index + 1, term, commitlog.KIND_MESSAGES, FORGED, position)
    return AppendRequest(src, dst, term, prev_index, prev_term, (entry,), prev_index + 1)


def forged_transfer_vote(src: int, dst: int, term: int) -> VoteRequest:
    """A leadership-transfer campaign's vote request: it overrides the lease."""
    return VoteRequest(src, dst, term + 1, 1 << 40, term, pre_vote=False, transfer=True)


async def send_forged(port: int, msg: Message, *, src: int | None = None,
                      with_nonce: bool = False, wait: float = 5.0, group: str = "g1",
                      host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> bool:
    """Connect to `host`:`port` (over `tls` if given), HELLO as `src`
    (default `msg.src`), send `msg`; True when the server closed the
    connection (or failed its TLS handshake) within `wait` s; a port nobody
    listens on raises ConnectionRefusedError. `with_nonce`: pretend to
    authenticate, answer the challenge with junk."""
    try:
        async with asyncio.timeout(wait):
            reader, writer = await asyncio.open_connection(
                host, port, ssl=tls, server_hostname=host if tls else None)
    except TimeoutError:
        return False
    except (ConnectionResetError, ssl.SSLError):
        return True
    try:
        nonce = os.urandom(16) if with_nonce else None
        writer.write(encode_frame(encode_hello(group, msg.src if src is None else src, msg.dst,
                                               msg.channel, nonce)))
        async with asyncio.timeout(wait):
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                if with_nonce and await read_frame(reader, 4096) is not None:
                    writer.write(encode_frame(encode_proof(os.urandom(32))))
                writer.write(encode_frame(encode_message(msg)))
                await writer.drain()
                while await reader.read(4096):
                    pass
        return True
    except TimeoutError:
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
