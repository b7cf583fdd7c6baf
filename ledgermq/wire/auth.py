"""Who is on the other end of a connection: keys, principals and the
challenge-response proofs of the AUTH handshake (docs/security.md).

A party proves it holds the secret of an access key without sending the
secret: the server's HELLO answer carries a fresh random challenge, the
client answers with AUTH {access_key, nonce, proof} where the proof is an
HMAC-SHA256 of the challenge, its own nonce and what it claims to be, and the
server answers with its own proof over the same values, so each side knows the
other holds the secret (mutual). A replayed AUTH is useless: every connection
gets a new challenge. Proofs are compared in constant time.

The cluster's members (brokers of a group, brokers with their NameServers,
Raft peers) use the same proofs with the cluster secret (`CLUSTER_KEY`);
clients use their users' access keys. What a principal may then do is the ACL
policy's business, not this module's.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ledgermq.base.small_file import NotReadable, read_small_file

# The access key under which cluster members prove membership with the
# cluster secret. No user may be called this.
CLUSTER_KEY = "cluster"
CHALLENGE_BYTES = 16
SECRET_BYTES_MIN = 16
SECRET_FILE_BYTES_MAX = 4096  # a generated secret is 64 hex characters
ACCESS_KEY_MAX = 128
# Domain separation: a proof made for one purpose never verifies for another.
_CLIENT = b"ledgermq-auth-v1 client\x00"
_SERVER = b"ledgermq-auth-v1 server\x00"
_HTTP = b"ledgermq-auth-v1 http\x00"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated party: a user (by access key) or a cluster member.
    `admin`: may run topic, group, offset, ACL and leadership operations."""

    name: str
    cluster_member: bool = False
    admin: bool = False


ANONYMOUS = Principal("anonymous")
# Whoever proves the cluster secret: a broker, a NameServer or a Raft peer.
# Members may do everything an administrator may.
CLUSTER_MEMBER = Principal(CLUSTER_KEY, cluster_member=True, admin=True)


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a party proves itself with: an access key and its secret."""

    access_key: str
    secret: bytes

    def __post_init__(self) -> None:
        if not self.access_key or len(self.access_key) > ACCESS_KEY_MAX:
            raise ValueError(f"an access key is 1 to {ACCESS_KEY_MAX} characters")
        if len(self.secret) < SECRET_BYTES_MIN:
            raise ValueError(f"a secret is at least {SECRET_BYTES_MIN} bytes")

    def __repr__(self) -> str:  # never print a secret
        return f"Credentials(access_key={self.access_key!r}, secret=<{len(self.secret)} bytes>)"


class KeyStore(Protocol):
    """Looks up the secret of an access key and whom it authenticates."""

    def lookup(self, access_key: str) -> tuple[bytes, Principal] | None:
        """(secret, principal) for a known key, None for an unknown one."""
        ...


def new_challenge() -> bytes:
    return secrets.token_bytes(CHALLENGE_BYTES)


def _mac(secret: bytes, domain: bytes, *parts: bytes) -> bytes:
    mac = hmac.new(secret, domain, hashlib.sha256)
    for part in parts:
        # Length-prefixed, so ("ab", "c") and ("a", "bc") sign differently.
        mac.update(len(part).to_bytes(4, "big"))
        mac.update(part)
    return mac.digest()


def client_proof(secret: bytes, challenge: bytes, nonce: bytes, claim: str) -> bytes:
    """The client's answer to `challenge`: binds its nonce and what it claims
    to be (e.g. "role:name" or a Raft peer's "group/from->to")."""
    return _mac(secret, _CLIENT, challenge, nonce, claim.encode())


def server_proof(secret: bytes, challenge: bytes, nonce: bytes, claim: str) -> bytes:
    """The server's answer to the client's nonce, over the same values."""
    return _mac(secret, _SERVER, challenge, nonce, claim.encode())


def request_signature(secret: bytes, canonical: str) -> bytes:
    """The signature of one admin HTTP request: the same HMAC as the proofs,
    over the request's canonical string (ledgermq/webadmin/signing.py builds
    it) under its own domain, so a signature is never a valid proof."""
    return _mac(secret, _HTTP, canonical.encode())


def proof_matches(expected: bytes, got: object) -> bool:
    """Constant-time comparison; anything but bytes of the right length fails."""
    return isinstance(got, bytes) and hmac.compare_digest(expected, got)


class SecretFileError(ValueError):
    """A secret file that is missing, too short, or readable by others."""


def read_secret_file(path: str | os.PathLike[str]) -> bytes:
    """The secret in `path` (surrounding whitespace stripped). Refuses a file
    that group or others may read, as ssh does for private keys, anything
    but a regular file, and more than SECRET_FILE_BYTES_MAX bytes (checked
    before reading: a wrong path such as /dev/zero is never read)."""
    file = Path(path)

    def private(mode: int) -> None:
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SecretFileError(f"secret file {file} is accessible by group or others "
                                  f"(mode {stat.S_IMODE(mode):04o}); chmod 600 it")

    try:
        raw = read_small_file(file, SECRET_FILE_BYTES_MAX, private)
    except NotReadable as exc:
        raise SecretFileError(f"cannot read secret file {file}: {exc}") from None
    raw = raw.strip()
    if len(raw) < SECRET_BYTES_MIN:
        raise SecretFileError(f"secret file {file} holds {len(raw)} bytes; "
                              f"at least {SECRET_BYTES_MIN} are needed")
    return raw


def write_secret_file(path: str | os.PathLike[str], secret: bytes | None = None) -> bytes:
    """Create `path` with mode 0600 holding `secret` (a new random one by
    default, as hex text) and return it. Never overwrites an existing file."""
    value = secret if secret is not None else secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(value + b"\n")
    return value
