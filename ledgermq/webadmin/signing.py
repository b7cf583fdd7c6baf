"""Signed admin HTTP requests: no secret ever crosses the wire
(docs/security.md, "The admin HTTP API").

A caller signs each request with the secret of its access key:

    Authorization: LMQ-HMAC-SHA256 Credential=<access key>, Timestamp=<unix ms>,
                   Nonce=<hex>, Signature=<hex>

The signature is `ledgermq.wire.auth.request_signature(secret, canonical)`
(the HMAC-SHA256 of the wire handshake's proofs, under an HTTP domain) over the
canonical string of the request, one line each:

    LMQ-HMAC-SHA256
    <METHOD>
    <path: every segment percent-decoded, then re-encoded (RFC 3986 unreserved kept)>
    <query: every name=value pair decoded, re-encoded the same way, sorted, joined by &>
    <timestamp ms>
    <nonce>
    <hex SHA-256 of the body bytes>

Decoding before re-encoding makes the string independent of how a client
library chose to escape (`%7C` or `|`, `+` or `%20`), so the Python client,
the NameServer's forwarder and the dashboard's JavaScript (dashboard/sign.js)
agree byte for byte. A server refuses a timestamp more than `MAX_SKEW_MS` off
its clock and a nonce it has seen within the window (a bounded `ReplayCache`),
so a captured request cannot be played again.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote

from ledgermq.base.clock import monotonic_ms, now_ms
from ledgermq.wire.auth import Credentials, KeyStore, Principal, request_signature

SCHEME = "LMQ-HMAC-SHA256"
# How far a request's timestamp may be from the server's clock, either way.
MAX_SKEW_MS = 5 * 60 * 1000
NONCE_BYTES = 16
_NONCE_RE = re.compile(r"[0-9a-f]{16,64}")
_HEX_SIGNATURE_RE = re.compile(r"[0-9a-f]{64}")
# Nonces remembered at most (about 100 bytes each): beyond this many signed
# requests within 2 * MAX_SKEW_MS a server answers 429 rather than forget a
# nonce that could still be replayed.
REPLAY_CAPACITY = 100_000


class SignatureError(Exception):
    """A request whose signature does not authenticate it. `reason` is a short
    label for logs and metrics; the message is what the caller is told."""

    def __init__(self, reason: str, message: str, access_key: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.access_key = access_key


def _enc(text: str) -> str:
    return quote(text, safe="")


def canonical_path(raw_path: str) -> str:
    """The path with each segment decoded and re-encoded (a `/` inside a
    segment stays `%2F`: it never becomes a separator)."""
    return "/".join(_enc(unquote(segment)) for segment in raw_path.split("/"))


def canonical_query(raw_query: str) -> str:
    """The query's pairs decoded, re-encoded, sorted and joined by `&`."""
    pairs = parse_qsl(raw_query, keep_blank_values=True)
    return "&".join(sorted(f"{_enc(k)}={_enc(v)}" for k, v in pairs))


def canonical_request(method: str, raw_path: str, raw_query: str, timestamp_ms: int,
                      nonce: str, body: bytes) -> str:
    """The string a request's signature covers."""
    return "\n".join((SCHEME, method.upper(), canonical_path(raw_path),
                      canonical_query(raw_query), str(timestamp_ms), nonce,
                      hashlib.sha256(body).hexdigest()))


def authorization(credentials: Credentials, method: str, raw_path: str, raw_query: str,
                  body: bytes, *, timestamp_ms: int | None = None,
                  nonce: str | None = None) -> str:
    """The `Authorization` header value that signs this request now."""
    ts = now_ms() if timestamp_ms is None else timestamp_ms
    nonce = nonce if nonce is not None else secrets.token_hex(NONCE_BYTES)
    canonical = canonical_request(method, raw_path, raw_query, ts, nonce, body)
    signature = request_signature(credentials.secret, canonical).hex()
    return (f"{SCHEME} Credential={credentials.access_key}, Timestamp={ts}, "
            f"Nonce={nonce}, Signature={signature}")


@dataclass(frozen=True, slots=True)
class SignedHeader:
    access_key: str
    timestamp_ms: int
    nonce: str
    signature: str


def parse_authorization(value: str) -> SignedHeader:
    """The fields of an `LMQ-HMAC-SHA256` header; SignatureError if malformed."""
    scheme, _, rest = value.strip().partition(" ")
    if scheme != SCHEME:
        raise SignatureError("malformed", f"the Authorization header must use {SCHEME}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, val = part.strip().partition("=")
        if not eq or name in fields:
            raise SignatureError("malformed", f"malformed {SCHEME} field {part.strip()!r}")
        fields[name] = val
    if set(fields) != {"Credential", "Timestamp", "Nonce", "Signature"}:
        raise SignatureError("malformed", f"{SCHEME} needs exactly Credential, Timestamp,"
                             " Nonce and Signature")
    key, ts, nonce, sig = (fields[k] for k in ("Credential", "Timestamp", "Nonce", "Signature"))
    if not key or len(key) > 128:
        raise SignatureError("malformed", "Credential must be an access key of 1-128 characters")
    if not (ts.isascii() and ts.isdigit() and len(ts) <= 16):
        raise SignatureError("malformed", "Timestamp must be Unix milliseconds", key)
    if not _NONCE_RE.fullmatch(nonce):
        raise SignatureError("malformed", "Nonce must be 16-64 lower-case hex digits", key)
    if not _HEX_SIGNATURE_RE.fullmatch(sig):
        raise SignatureError("malformed", "Signature must be 64 lower-case hex digits", key)
    return SignedHeader(key, int(ts), nonce, sig)


class ReplayCache:
    """Nonces seen recently, per access key. An entry is kept for twice the
    skew window after it arrived: by then its timestamp (at most one window
    ahead of arrival) is stale, so the timestamp check alone refuses a replay.
    Arrival order is expiry order, so expired entries leave from the front."""

    def __init__(self, capacity: int = REPLAY_CAPACITY, keep_ms: int = 2 * MAX_SKEW_MS,
                 clock: Callable[[], int] = monotonic_ms) -> None:
        self.capacity = capacity
        self.keep_ms = keep_ms
        self.clock = clock
        # "key\0nonce" -> expiry (monotonic ms), oldest first: an OrderedDict
        # drops its first entry in O(1), a dict's iterator would rescan holes.
        self._seen: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, access_key: str, nonce: str) -> None:
        """Remember the nonce, or raise SignatureError when it was seen or
        the cache is full of nonces that could still be replayed."""
        now = self.clock()
        while self._seen and next(iter(self._seen.values())) <= now:
            self._seen.popitem(last=False)
        entry = f"{access_key}\0{nonce}"
        if entry in self._seen:
            raise SignatureError("replayed", "this request's nonce was already used: sign each"
                                 " request with a fresh nonce", access_key)
        if len(self._seen) >= self.capacity:
            raise SignatureError("replay_cache_full", "too many signed requests in the last"
                                 " minutes: retry later", access_key)
        self._seen[entry] = now + self.keep_ms


class Verifier:
    """Checks a request's signature against a KeyStore; the Principal it
    authenticates, or SignatureError."""

    def __init__(self, keys: KeyStore, replay: ReplayCache | None = None,
                 clock: Callable[[], int] = now_ms, max_skew_ms: int = MAX_SKEW_MS) -> None:
        self.keys = keys
        self.replay = replay if replay is not None else ReplayCache()
        self.clock = clock
        self.max_skew_ms = max_skew_ms

    def verify(self, header: str, method: str, raw_path: str, raw_query: str,
               body: bytes) -> Principal:
        signed = parse_authorization(header)
        skew = signed.timestamp_ms - self.clock()
        if abs(skew) > self.max_skew_ms:
            raise SignatureError("stale", f"the request's timestamp is {abs(skew) // 1000} s"
                                 f" {'ahead of' if skew > 0 else 'behind'} the server's clock"
                                 f" (at most {self.max_skew_ms // 1000} s allowed)",
                                 signed.access_key)
        found = self.keys.lookup(signed.access_key)
        if found is None:
            raise SignatureError("unknown_key", "unknown access key or wrong signature",
                                 signed.access_key)
        secret, principal = found
        canonical = canonical_request(method, raw_path, raw_query, signed.timestamp_ms,
                                      signed.nonce, body)
        expected = request_signature(secret, canonical).hex()
        if not hmac.compare_digest(expected, signed.signature):
            # The same message as an unknown key: a caller learns nothing
            # about which access keys exist.
            raise SignatureError("bad_signature", "unknown access key or wrong signature",
                                 signed.access_key)
        # Only after the signature: strangers cannot fill the replay cache.
        self.replay.admit(signed.access_key, signed.nonce)
        return principal


class StaticKeyStore:
    """A fixed set of keys: {access key: (secret, principal)}. The NameServer's
    (the cluster key and its command line's administrator)."""

    def __init__(self, keys: Mapping[str, tuple[bytes, Principal]]) -> None:
        self._keys = dict(keys)

    def lookup(self, access_key: str) -> tuple[bytes, Principal] | None:
        return self._keys.get(access_key)
