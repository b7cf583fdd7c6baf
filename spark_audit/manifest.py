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
the document carries the SHA-256 of its canonical JSON (keys sorted, no
spaces), which a damaged or hand-edited file fails; then the schema is
strict (no unknown or missing keys, integers in range, spans sorted,
disjoint and inside one block, parts inside their span, digests of 32 hex
digits). A SHA-256 detects damage and edits, not a forger who recomputes it
(that would take a key kept away from the state directory). It is written
atomically: a temporary file in the same directory, fsync, rename, fsync of
the directory; a crash leaves the old manifest or the new one, never half.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spark_audit import digest

FORMAT: Literal[1] = 1
MAX_INDEX = (1 << 63) - 1
NIGHT_ID = r"^\d{8}T\d{6}Z$"
# Group and replica names (group names become file names): the alphabet night.json
# allows (no "/", never starting with ".").
GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:%|@+-]{0,127}")
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


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def load(state_dir: str, group: str) -> Manifest | None:
    """The group's manifest; None when there is none yet; ``ManifestError`` when it
    cannot be believed."""
    path = path_of(state_dir, group)
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            raise ManifestError(f"manifest {path}: larger than {MAX_FILE_BYTES} bytes")
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ManifestError(f"manifest {path}: cannot be read: {exc}") from None
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates,
                         parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"manifest {path}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("sha256"), str):
        raise ManifestError(f"manifest {path}: no sha256 of its content")
    claimed = doc.pop("sha256")
    actual = hashlib.sha256(canonical(doc)).hexdigest()
    if claimed != actual:
        raise ManifestError(f"manifest {path}: its content does not match its sha256 "
                            f"(recorded {claimed[:16]}..., content {actual[:16]}...): the file "
                            "was damaged or edited; it is refused (move it away to start the "
                            "group's manifest afresh)")
    try:
        m = Manifest.model_validate(doc)
    except ValidationError as exc:
        raise ManifestError(f"manifest {path}: {exc}") from None
    if m.group != group:
        raise ManifestError(f"manifest {path}: is group {m.group!r}'s, not {group!r}'s")
    return m


def save(state_dir: str, m: Manifest) -> str:
    """Write the manifest atomically; returns its path."""
    path = path_of(state_dir, m.group)
    doc = m.model_dump(mode="json")
    Manifest.model_validate(doc)  # what the next night will read must be believable
    doc["sha256"] = hashlib.sha256(canonical(doc)).hexdigest()
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
