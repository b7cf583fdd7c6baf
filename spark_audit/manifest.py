"""The nightly audit's manifest of one group: which index spans were verified, when,
and what each replica held there (``DIR/manifest/<group>.json``).

A span is a range of Raft indexes inside one digest block (``digest.split``);
per replica it records the part it held (from ``lo``: retention may have
cut the replica inside the span), how many entries and their digest
(``digest``). The topic deletions of the verified log are kept too: a
later window below one must know it. The nightly audit (``nightly``) reads the manifest before a
night, re-verifies some spans against it, and writes it back after a night
that passed.

The file is a claim the next night acts on, so it is checked before it is
believed and refused with a message naming it otherwise (``ManifestError``):
the document carries a seal of its canonical JSON (keys sorted, no
spaces), which a damaged or hand-edited file fails; then the schema is
strict (no unknown or missing keys, integers in range, spans sorted,
disjoint and inside one block, parts inside their span, digests of 32 hex
digits). The seal is its SHA-256 (``sha256``), which detects damage and
edits but not a forger who recomputes it, or, with a manifest key (``key``:
``--manifest-key-file``, a secret file kept away from the state directory
and the brokers' hosts), its HMAC-SHA256 under that key (``hmac_sha256``),
which nobody without the key can make: whoever could rewrite both the
replicas' data and the manifest's digests would still fail the night that
re-verifies the span. A manifest sealed one way is refused when read the
other way (a keyed deployment does not fall back to a plain seal). It is written
atomically: a temporary file in the same directory, fsync, rename, fsync of
the directory; a crash leaves the old manifest or the new one, never half.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import tempfile
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ledgermq.base.audit_night import NAME, strict_json
from ledgermq.base.small_file import NotReadable, read_small_file
from spark_audit import digest

FORMAT: Literal[1] = 1
MAX_INDEX = (1 << 63) - 1
NIGHT_ID = r"^\d{8}T\d{6}Z$"
# Group and replica names (group names become file names): the alphabet night.json
# allows (no "/", never starting with ".").
GROUP_NAME = NAME
MAX_FILE_BYTES = 256 << 20

Index = Annotated[int, Field(ge=1, le=MAX_INDEX)]
Count = Annotated[int, Field(ge=0, le=MAX_INDEX)]


class ManifestError(ValueError):
    """A manifest that cannot be believed; the message names the file."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Part(_Strict):
    """What one replica held of a span when it was last verified."""

    lo: Index  # the part starts here (the span's start, or where retention cut it)
    entries: Annotated[int, Field(ge=1, le=MAX_INDEX)]
    digest: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]


class Span(_Strict):
    """Indexes ``lo..hi``, last verified at ``verified`` by night ``night`` (the
    ``night_no``-th night of the rotation), with each replica's part."""

    lo: Index
    hi: Index
    night: Annotated[str, Field(pattern=NIGHT_ID)]
    night_no: Count
    verified: float
    replicas: dict[str, Part]

    @model_validator(mode="after")
    def _consistent(self) -> Span:
        if self.lo > self.hi:
            raise ValueError(f"span {self.lo}..{self.hi} ends before it starts")
        if not (math.isfinite(self.verified) and self.verified >= 0):
            raise ValueError(f"span {self.lo}..{self.hi}: verified {self.verified} is not a "
                             "time")
        for name, p in self.replicas.items():
            if not GROUP_NAME.fullmatch(name):
                raise ValueError(f"span {self.lo}..{self.hi}: replica name {name[:40]!r}")
            if not self.lo <= p.lo <= self.hi or p.entries != self.hi - p.lo + 1:
                raise ValueError(f"span {self.lo}..{self.hi}: replica {name}'s part from "
                                 f"{p.lo} with {p.entries} entries does not fit it")
        return self


class Deletion(_Strict):
    """A ``topic.delete`` entry of the verified log: the topic's messages in earlier
    entries are dead (a window below it must know it, ``prepare.dead_before``)."""

    index: Index
    topic: Annotated[str, Field(min_length=1, max_length=255)]


class Manifest(_Strict):
    format: Literal[1]
    group: str
    block: int
    nights: Count  # passed nights of the rotation so far
    verified_through: Count  # the highest index verified (0: none)
    spans: list[Span]
    deletions: list[Deletion]

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if not GROUP_NAME.fullmatch(self.group):
            raise ValueError(f"group name {self.group[:40]!r}")
        digest.check_block(self.block)
        prev = 0
        for s in self.spans:
            if s.lo <= prev:
                raise ValueError(f"span {s.lo}..{s.hi} overlaps or precedes the one before")
            if s.lo // self.block != s.hi // self.block:
                raise ValueError(f"span {s.lo}..{s.hi} crosses a block of {self.block}")
            if s.night_no > self.nights:
                raise ValueError(f"span {s.lo}..{s.hi}: night {s.night_no} of {self.nights}")
            prev = s.hi
        if prev > self.verified_through:
            raise ValueError(f"spans reach {prev}, past verified_through "
                             f"{self.verified_through}")
        return self

    def entries(self) -> int:
        """Indexes the spans cover."""
        return sum(s.hi - s.lo + 1 for s in self.spans)


def empty(group: str, block: int = digest.DEFAULT_BLOCK) -> Manifest:
    return Manifest(format=FORMAT, group=group, block=digest.check_block(block), nights=0,
                    verified_through=0, spans=[], deletions=[])


def path_of(state_dir: str, group: str) -> str:
    if not GROUP_NAME.fullmatch(group):
        raise ManifestError(f"group {group[:40]!r}: not a name a manifest file can have")
    return os.path.join(state_dir, "manifest", f"{group}.json")


def canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


SEALS = ("sha256", "hmac_sha256")


def seal(content: bytes, key: bytes | None) -> tuple[str, str]:
    """(field, hex): the SHA-256 of ``content``, or its HMAC-SHA256 under ``key``."""
    if key is None:
        return "sha256", hashlib.sha256(content).hexdigest()
    return "hmac_sha256", hmac.new(key, content, hashlib.sha256).hexdigest()


def load(state_dir: str, group: str, key: bytes | None = None) -> Manifest | None:
    """The group's manifest; None when there is none yet; ``ManifestError`` when it
    cannot be believed (``key``: the manifest key it must be sealed with)."""
    path = path_of(state_dir, group)
    try:
        os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ManifestError(f"manifest {path}: cannot be read: {exc}") from None
    try:
        # A regular file, read up to the bound: a manifest replaced by a link
        # to /dev/zero or by a FIFO is refused, not read for ever.
        raw = read_small_file(path, MAX_FILE_BYTES)
    except NotReadable as exc:
        raise ManifestError(f"manifest {path}: cannot be read: {exc}") from None
    try:
        doc = strict_json(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"manifest {path}: not valid JSON: {exc}") from None
    _check_seal(path, doc, key)
    try:
        m = Manifest.model_validate(doc)
    except ValidationError as exc:
        raise ManifestError(f"manifest {path}: {exc}") from None
    if m.group != group:
        raise ManifestError(f"manifest {path}: is group {m.group!r}'s, not {group!r}'s")
    return m


def _check_seal(path: str, doc: Any, key: bytes | None) -> None:
    """Take the seal out of ``doc`` and check it, or raise ``ManifestError``."""
    present = [f for f in SEALS if isinstance(doc, dict) and f in doc]
    if len(present) != 1 or not isinstance(doc[present[0]], str):
        raise ManifestError(f"manifest {path}: not one seal of its content (sha256 or "
                            "hmac_sha256)")
    claimed = doc.pop(present[0])
    expected_field, expected = seal(canonical(doc), key)
    if present[0] != expected_field:
        why = ("sealed with a manifest key: give it (--manifest-key-file) to read it"
               if key is None else
               "not sealed with the manifest key (written without it, or by someone "
               "who does not hold it); it is refused (move it away to start the group's "
               "manifest afresh)")
        raise ManifestError(f"manifest {path}: {why}")
    if not hmac.compare_digest(claimed, expected):
        raise ManifestError(f"manifest {path}: its content does not match its "
                            f"{expected_field} (recorded {claimed[:16]}..., content "
                            f"{expected[:16]}...): the file was damaged or edited, or sealed "
                            "with another key; it is refused (move it away to start the "
                            "group's manifest afresh)")


def save(state_dir: str, m: Manifest, key: bytes | None = None) -> str:
    """Write the manifest atomically, sealed (with ``key`` when given); returns its path."""
    path = path_of(state_dir, m.group)
    doc = m.model_dump(mode="json")
    Manifest.model_validate(doc)  # what the next night will read must be believable
    name, value = seal(canonical(doc), key)
    doc[name] = value
    write_atomic(path, json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n")
    return path


def write_atomic(path: str, data: bytes) -> None:
    """``data`` to ``path`` via a temporary file and a rename, both synced."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
