"""The planted-corruption suite: cases planted into a copy of a real run's replicas.

The base is a real run (``bench/audit_corruption.py --record``): the data
directories of a 3-node group and the client history, packed as a .tar.gz.
Each case copies the base, plants one kind of damage with byte-level edits
(written from docs/storage-format.md; "re-CRC'd" cases recompute the CRCs so
only the audit's cross-checks can tell), and names every violation the audit
must report, as (check, kind, replica), plus where the main one must point
(file and byte offset, or Raft index). The audit must report exactly those
violations: a missing one is a miss, an extra one overstates.

Entries are located with the audit's own parser (``parse.scan_segment``);
nothing here imports the broker or the storage engine.
"""

from __future__ import annotations

import itertools
import os
import shutil
import struct
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from spark_audit import fmt, parse
from spark_audit.audit import AuditOptions, AuditResult, run_audit
from spark_audit.engine import Engine, LocalEngine

GROUP = "chaos"
NODES = ("n1", "n2", "n3")
U64_MAX = (1 << 64) - 1

# (check, kind, replica name or "" for a group-level finding)
Violation = tuple[str, str, str]


@dataclass
class Where:
    """Where a case's main finding must point: its kind and replica, and the file
    (relative to the replica's data dir) and byte offset, or the Raft index."""

    kind: str
    replica: str
    file: str = ""
    file_offset: int = -1
    index: int = -1
    slot: int = -1  # a ConsumeQueue slot


@dataclass
class Case:
    plant: Callable[[Path], Where]  # gets the group dir (…/data/chaos), plants, says where
    expect: set[Violation]
    about: str = ""
    info: set[str] = field(default_factory=set)  # info kinds that must be reported too


# ------------------------------------------------------------------ locating


@dataclass
class Ent:
    path: Path
    off: int  # file offset
    index: int
    term: int
    position: int
    size: int
    kind: int


def entries(node: Path) -> list[Ent]:
    out = []
    for seg in sorted((node / "commitlog").iterdir()):
        base = int(seg.name)
        scan = parse.scan_segment(seg.read_bytes(), base)
        for e in scan.entries:
            out.append(Ent(seg, int(e["file_offset"]), int(e["index"]), int(e["term"]),
                           int(e["position"]), int(e["size"]), int(e["kind"])))
    return out


def entry(node: Path, index: int) -> Ent:
    return next(e for e in entries(node) if e.index == index)


def message_entries(node: Path) -> list[Ent]:
    return [e for e in entries(node) if e.kind == fmt.KIND_MESSAGES]


def rel(node: Path, path: Path) -> str:
    return str(path.relative_to(node))


# ------------------------------------------------------------------ byte edits


def read_at(path: Path, off: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(n)


def write_at(path: Path, off: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(data)


def flip(path: Path, off: int, mask: int = 0x01) -> None:
    write_at(path, off, bytes([read_at(path, off, 1)[0] ^ mask]))


def header(index: int, term: int, position: int, kind: int, body: bytes) -> bytes:
    """A valid 48-byte entry header for ``body``."""
    head = fmt.ENTRY_HEADER.pack(fmt.ENTRY_MAGIC, fmt.FORMAT_VERSION, kind, 0, 48 + len(body),
                                 fmt.crc(body), index, term, position, 0)
    return head + struct.pack("<I", fmt.crc(head))


def rewrite(e: Ent, *, body: bytes | None = None, index: int | None = None,
            term: int | None = None, kind: int | None = None) -> None:
    """Rewrite entry ``e`` in place with valid CRCs (same size)."""
    old = read_at(e.path, e.off + 48, e.size - 48)
    body = old if body is None else body
    assert len(body) == len(old)
    write_at(e.path, e.off, header(e.index if index is None else index,
                                   e.term if term is None else term, e.position,
                                   e.kind if kind is None else kind, body))
    write_at(e.path, e.off + 48, body)


def body_of(e: Ent) -> bytes:
    return read_at(e.path, e.off + 48, e.size - 48)


def first_record_body(e: Ent) -> tuple[int, int]:
    """(file offset, length) of the body of the first message record of a MESSAGES entry."""
    size, *_rest = fmt.MESSAGE_HEADER.unpack(read_at(e.path, e.off + 48, 68))
    body_len = _rest[-1]
    return e.off + 48 + size - body_len, body_len


def rewritten_body(e: Ent) -> bytes:
    """``e``'s body with its first record's message body changed (same length)."""
    body = bytearray(body_of(e))
    at, n = first_record_body(e)
    at -= e.off + 48
    body[at + n - 1] ^= 0x20  # the filler's last byte: same value, another body
    return bytes(body)


def small_file(path: Path, struct_: struct.Struct, **values: int) -> None:
    """Rewrite fields of the checkpoint or the hardstate, CRC recomputed."""
    raw = bytearray(path.read_bytes())
    names = {fmt.CHECKPOINT: ("magic", "version", "durable_index", "durable_end",
                              "durable_term", "first_index", "reserved"),
             fmt.HARDSTATE: ("magic", "version", "term", "vote", "commit", "reserved")}[struct_]
    fields = dict(zip(names, struct_.unpack_from(raw), strict=True))
    fields.update(values)
    head = struct_.pack(*(fields[n] for n in names))
    path.write_bytes(head + struct.pack("<I", fmt.crc(head)))


def cq_file(node: Path, queue: int) -> Path:
    d = node / "consumequeue" / GROUP / str(queue)
    return d / sorted(os.listdir(d))[0]


def unit(path: Path, slot: int) -> tuple[int, int, int]:
    return fmt.CQ_UNIT.unpack(read_at(path, slot * 20, 20))


def set_unit(path: Path, slot: int, offset: int, size: int, tag: int) -> None:
    write_at(path, slot * 20, fmt.CQ_UNIT.pack(offset, size, tag))


def all_nodes(g: Path) -> list[Path]:
    return [g / n for n in NODES]


# ------------------------------------------------------------------ the cases

MID = 150  # a MESSAGES entry in the middle of the log is picked near this index


def mid_messages(node: Path, after: int = MID) -> Ent:
    return next(e for e in message_entries(node) if e.index >= after)


def body_flip(g: Path) -> Where:
    e = mid_messages(g / "n2")
    at, n = first_record_body(e)
    flip(e.path, at + n // 2)
    return Where("body_crc", "n2", rel(g / "n2", e.path), e.off, e.index)


def body_flip_everywhere(g: Path) -> Where:
    for node in all_nodes(g):
        e = mid_messages(node)
        at, n = first_record_body(e)
        flip(node / rel(node, e.path), at + n // 2)
    e = mid_messages(g / "n1")
    return Where("body_crc", "n1", rel(g / "n1", e.path), e.off, e.index)


def header_flip(g: Path) -> Where:
    e = mid_messages(g / "n2")
    flip(e.path, e.off + 24)  # the term's low byte, CRC left stale
    return Where("header_crc", "n2", rel(g / "n2", e.path), e.off)


def magic_zeroed(g: Path) -> Where:
    e = mid_messages(g / "n3", 60)
    write_at(e.path, e.off, b"\0\0\0\0")
    return Where("bad_magic", "n3", rel(g / "n3", e.path), e.off)


def truncated_mid_entry(g: Path) -> Where:
    node = g / "n3"
    e = mid_messages(node, 260)
    cut = e.off + e.size // 2
    with open(e.path, "r+b") as f:
        f.truncate(cut)
    for later in sorted((node / "commitlog").iterdir()):
        if later.name > e.path.name:
            later.unlink()
    return Where("torn_tail", "n3", rel(node, e.path), e.off, e.index)


def last_segment_lost(g: Path) -> Where:
    node = g / "n2"
    last = sorted((node / "commitlog").iterdir())[-1]
    first = next(e for e in entries(node) if e.path == last)
    last.unlink()
    return Where("committed_entries_missing", "n2", index=first.index)


def _drop_last_entry_of_a_segment(node: Path, renumber: bool) -> Ent:
    """Cut the last entry of the second segment; with ``renumber`` every later entry
    is rewritten one index lower (valid CRCs), so the log stays contiguous."""
    ents = entries(node)
    segs = sorted({e.path for e in ents})
    victim = [e for e in ents if e.path == segs[1]][-1]
    with open(victim.path, "r+b") as f:
        f.truncate(victim.off)
    if renumber:
        for e in ents:
            if e.index > victim.index:
                rewrite(e, index=e.index - 1)
    return victim


def entry_dropped(g: Path) -> Where:
    v = _drop_last_entry_of_a_segment(g / "n2", renumber=False)
    return Where("index_gap", "n2", index=v.index + 1)


def entry_dropped_renumbered(g: Path) -> Where:
    v = _drop_last_entry_of_a_segment(g / "n2", renumber=True)
    return Where("divergent_entry", "n2", index=v.index)


def entry_duplicated(g: Path) -> Where:
    """n2's last entry appended again (same index), at the right position, valid CRCs."""
    node = g / "n2"
    e = entries(node)[-1]
    body = body_of(e)
    end = e.off + e.size
    write_at(e.path, end, header(e.index, e.term, e.position + e.size, e.kind, body) + body)
    return Where("index_repeated", "n2", rel(node, e.path), end, e.index)


def entry_duplicated_renumbered(g: Path) -> Where:
    """Every replica: the last MESSAGES entry appended again as the next index (valid
    CRCs), and the hardstate commit raised over it: one message committed twice."""
    for node in all_nodes(g):
        last = entries(node)[-1]
        e = message_entries(node)[-1]
        body = body_of(e)
        end = last.off + last.size
        write_at(last.path, end, header(last.index + 1, last.term, last.position + last.size,
                                        e.kind, body) + body)
        small_file(node / "hardstate", fmt.HARDSTATE, commit=last.index + 1)
    return Where("duplicate_client_id", "", index=entries(g / "n1")[-1].index)


def _same_size_neighbours(node: Path) -> tuple[Ent, Ent]:
    ms = message_entries(node)
    return next((a, b) for a, b in itertools.pairwise(ms)
                if a.index >= MID and b.index == a.index + 1 and a.size == b.size
                and a.path == b.path)


def entries_swapped(g: Path) -> Where:
    """n2: two neighbouring entries' bytes swapped as they are (headers name the old
    positions)."""
    node = g / "n2"
    a, b = _same_size_neighbours(node)
    ra, rb = read_at(a.path, a.off, a.size), read_at(b.path, b.off, b.size)
    write_at(a.path, a.off, rb)
    write_at(b.path, b.off, ra)
    return Where("position_mismatch", "n2", rel(node, a.path), a.off)


def entries_swapped_renumbered(g: Path) -> Where:
    """Every replica: two neighbouring entries' bodies swapped, headers rewritten in
    log order with valid CRCs: consistent, but acks name the other offsets."""
    for node in all_nodes(g):
        a, b = _same_size_neighbours(node)
        ba, bb = body_of(a), body_of(b)
        rewrite(a, body=bb)
        rewrite(b, body=ba)
    return Where("acked_send_misplaced", "")


def cq_offset_plus_one(g: Path) -> Where:
    path = cq_file(g / "n1", 1)
    off, size, tag = unit(path, 10)
    set_unit(path, 10, off + 1, size, tag)
    return Where("cq_dangling", "n1", rel(g / "n1", path), slot=10)


def cq_units_swapped(g: Path) -> Where:
    path = cq_file(g / "n3", 2)
    a, b = unit(path, 20), unit(path, 21)
    set_unit(path, 20, *b)
    set_unit(path, 21, *a)
    return Where("cq_out_of_order", "n3", rel(g / "n3", path), slot=21)


def cq_wrong_size(g: Path) -> Where:
    path = cq_file(g / "n2", 0)
    off, size, tag = unit(path, 5)
    set_unit(path, 5, off, size + 4, tag)
    return Where("cq_size_mismatch", "n2", rel(g / "n2", path), slot=5)


def cq_wrong_tag(g: Path) -> Where:
    path = cq_file(g / "n2", 3)
    off, size, _tag = unit(path, 7)
    set_unit(path, 7, off, size, 0xDEADBEEF)
    return Where("cq_tag_mismatch", "n2", rel(g / "n2", path), slot=7)


def cq_wrong_everywhere(g: Path) -> Where:
    """Every replica: slot 30 of queue 0 points at slot 31's message (consistently)."""
    for node in all_nodes(g):
        path = cq_file(node, 0)
        set_unit(path, 30, *unit(path, 31))
    return Where("indexed_twice", "n1", rel(g / "n1", cq_file(g / "n1", 0)), slot=31)


def acked_erased_everywhere(g: Path) -> Where:
    """Every replica: a MESSAGES entry rewritten as a CONTROL entry of the same size
    (valid CRCs): its acknowledged message is gone from every replica."""
    filler = msgpack.packb({"op": "noop"})
    for node in all_nodes(g):
        e = mid_messages(node)
        body = (filler + b"\0" * e.size)[:e.size - 48]
        rewrite(e, body=body, kind=fmt.KIND_CONTROL)
    return Where("acked_send_missing", "")


def diverged_term(g: Path) -> Where:
    """n2: the last term-1 entry rewritten with term 2 (valid CRCs)."""
    node = g / "n2"
    e = [x for x in entries(node) if x.term == 1][-1]
    rewrite(e, term=2)
    return Where("divergent_entry", "n2", rel(node, e.path), e.off, e.index)


def _rewrite_bodies(g: Path, nodes: tuple[str, ...]) -> Ent:
    for name in nodes:
        e = mid_messages(g / name)
        rewrite(e, body=rewritten_body(e))
    return mid_messages(g / nodes[0])


def majority_rewrite(g: Path) -> Where:
    """n2 and n3: a message body rewritten consistently with valid CRCs. The majority
    agrees on it; the history's digest says n1 holds what was sent."""
    e = _rewrite_bodies(g, ("n2", "n3"))
    return Where("body_mismatch", "n2", rel(g / "n2", e.path), e.off, e.index)


def minority_rewrite(g: Path) -> Where:
    e = _rewrite_bodies(g, ("n3",))
    return Where("body_mismatch", "n3", rel(g / "n3", e.path), e.off, e.index)


def rewrite_everywhere(g: Path) -> Where:
    e = _rewrite_bodies(g, NODES)
    return Where("body_mismatch", "n1", rel(g / "n1", e.path), e.off, e.index)


def hardstate_term_max(g: Path) -> Where:
    small_file(g / "n1" / "hardstate", fmt.HARDSTATE, term=U64_MAX)
    return Where("implausible_value", "n1", "hardstate")


def hardstate_commit_max(g: Path) -> Where:
    small_file(g / "n2" / "hardstate", fmt.HARDSTATE, commit=U64_MAX)
    return Where("implausible_value", "n2", "hardstate")


def checkpoint_index_max(g: Path) -> Where:
    small_file(g / "n3" / "checkpoint", fmt.CHECKPOINT, durable_index=U64_MAX,
               durable_end=U64_MAX)
    return Where("implausible_value", "n3", "checkpoint")


def dispatch_index_max(g: Path) -> Where:
    path = g / "n3" / "consumequeue" / "checkpoint"
    raw = path.read_bytes()
    doc = msgpack.unpackb(raw[:-4], raw=False)
    doc["dispatched_index"] = U64_MAX
    body = msgpack.packb(doc)
    path.write_bytes(body + struct.pack("<I", fmt.crc(body)))
    return Where("implausible_value", "n3", "consumequeue/checkpoint")


def entry_index_max(g: Path) -> Where:
    node = g / "n2"
    e = entries(node)[-1]
    rewrite(e, index=U64_MAX)
    return Where("implausible_value", "n2", rel(node, e.path), e.off)


def entry_term_max(g: Path) -> Where:
    node = g / "n1"
    e = entries(node)[-1]
    rewrite(e, term=U64_MAX)
    return Where("implausible_value", "n1", rel(node, e.path), e.off)


def index_record_term_max(g: Path) -> Where:
    node = g / "n1"
    path = sorted((node / "index").iterdir())[0]
    slot = 99  # the record of Raft index 100
    raw = bytearray(read_at(path, slot * 32, 28))
    raw[8:16] = struct.pack("<Q", U64_MAX)
    write_at(path, slot * 32, bytes(raw) + struct.pack("<I", fmt.crc(bytes(raw))))
    return Where("implausible_value", "n1", rel(node, path), slot * 32, 100)


def cq_offset_max(g: Path) -> Where:
    path = cq_file(g / "n2", 1)
    _off, size, tag = unit(path, 12)
    set_unit(path, 12, U64_MAX, size, tag)
    return Where("implausible_value", "n2", rel(g / "n2", path), 12 * 20)


def write_identities(g: Path, **changed: dict[str, Any]) -> None:
    """Give every replica an ``IDENTITY`` (the recorded base predates them): node
    ``nK`` is node K of cluster ``GROUP`` with its own directory id; ``changed``
    overrides fields per node (``version`` is the format version written)."""
    for k, node in enumerate(NODES, start=1):
        fields: dict[str, Any] = {"node_id": k, "directory_id": 0x5EED0000 + k,
                                  "created_ms": 1_700_000_000_000, "cluster_id": GROUP,
                                  "version": fmt.FORMAT_VERSION, **changed.get(node, {})}
        version = fields.pop("version")
        (g / node / "IDENTITY").write_bytes(fmt.encode_identity(fmt.Identity(**fields), version))


def identity_damaged(g: Path) -> Where:
    write_identities(g)
    path = g / "n2" / "IDENTITY"
    raw = bytearray(path.read_bytes())
    raw[fmt.IDENTITY_HEAD.size] ^= 0x01  # the cluster id's first byte; the CRC is stale
    path.write_bytes(bytes(raw))
    return Where("bad_identity", "n2", "IDENTITY")


def identity_newer_format(g: Path) -> Where:
    write_identities(g, n3={"version": fmt.FORMAT_VERSION + 1})
    return Where("unsupported_format", "n3", "IDENTITY")


def identity_directory_id_zero(g: Path) -> Where:
    write_identities(g, n1={"directory_id": 0})
    return Where("implausible_value", "n1", "IDENTITY")


def identity_other_cluster(g: Path) -> Where:
    write_identities(g, n2={"cluster_id": "another-cluster"})
    return Where("identity_cluster_mismatch", "n2")


def identity_directory_copied(g: Path) -> Where:
    write_identities(g, n3={"directory_id": 0x5EED0001})  # n1's
    return Where("identity_directory_shared", "n3")


def identity_node_twice(g: Path) -> Where:
    write_identities(g, n3={"node_id": 1})
    return Where("identity_node_shared", "n1")


def _zero_page(node: Path, page: int) -> Path:
    seg = sorted((node / "commitlog").iterdir())[1]
    write_at(seg, page * 4096, bytes(4096))
    return seg


def zeroed_page(g: Path) -> Where:
    first = next(e for e in entries(g / "n2") if e.path.name == sorted(
        (g / "n2" / "commitlog").iterdir())[1].name and e.off + e.size > 4096)
    seg = _zero_page(g / "n2", 1)
    # The entry the page starts inside loses its tail: its body CRC fails.
    return Where("body_crc", "n2", rel(g / "n2", seg), first.off, first.index)


def zeroed_page_everywhere(g: Path) -> Where:
    for node in all_nodes(g):
        _zero_page(node, 1)
    return Where("acked_send_missing", "")


def _v(*items: str) -> set[Violation]:
    out = set()
    for item in items:
        check, kind, replica = [*item.split("/"), ""][:3]
        out.add((check, kind, replica))
    return out


_DAMAGED_ENTRY = ("corruption/{}/{n}", "index_validity/cq_dangling/{n}",
                  "lost_offsets/index_gap/{n}", "lost_offsets/position_gap/{n}")


def _entry_lost(kind: str, n: str) -> set[Violation]:
    """A header made unreadable on replica ``n``: the entry is skipped (a gap in
    indexes and positions) and units of its messages dangle."""
    return _v(*(x.format(kind, n=n) for x in _DAMAGED_ENTRY))


_LOG_CUT = ("lost_offsets/durable_entries_missing/{n}",
            "lost_offsets/committed_entries_missing/{n}")
_EVERY = ("n1", "n2", "n3")

CASES: dict[str, Case] = {
    "body_flip": Case(body_flip, _v(
        "corruption/body_crc/n2", "history/body_mismatch/n2"),
        "a message body bit flipped on n2, CRC stale"),
    "body_flip_everywhere": Case(body_flip_everywhere, _v(
        *(f"corruption/body_crc/{n}" for n in _EVERY),
        *(f"history/body_mismatch/{n}" for n in _EVERY)),
        "the same body bit flipped on every replica"),
    "header_flip": Case(header_flip, _entry_lost("header_crc", "n2"),
                        "a header bit (term) flipped on n2, CRC stale"),
    "magic_zeroed": Case(magic_zeroed, _entry_lost("bad_magic", "n3"),
                         "an entry's magic zeroed on n3"),
    "truncated_mid_entry": Case(truncated_mid_entry, _v(
        "corruption/torn_tail/n3", "index_validity/cq_dangling/n3",
        *(x.format(n="n3") for x in _LOG_CUT)),
        "n3's log cut in the middle of an entry before its durable point"),
    "last_segment_lost": Case(last_segment_lost, _v(
        "index_validity/cq_dangling/n2", *(x.format(n="n2") for x in _LOG_CUT)),
        "n2's last segment file removed"),
    "entry_dropped": Case(entry_dropped, _v(
        "lost_offsets/index_gap/n2", "lost_offsets/position_gap/n2",
        "index_validity/cq_dangling/n2"),
        "n2: the last entry of a segment cut out, later indexes kept"),
    "entry_dropped_renumbered": Case(entry_dropped_renumbered, _v(
        "divergence/divergent_entry/n2", "lost_offsets/position_gap/n2",
        "index_validity/raft_index_mismatch/n2", "index_validity/cq_dangling/n2",
        *(x.format(n="n2") for x in _LOG_CUT)),
        "n2: an entry cut out and every later one renumbered, re-CRC'd"),
    "entry_duplicated": Case(entry_duplicated, _v("duplicates/index_repeated/n2"),
                             "n2: its last entry written twice with the same index"),
    "entry_duplicated_renumbered": Case(entry_duplicated_renumbered, _v(
        "duplicates/duplicate_client_id"),
        "every replica: a MESSAGES entry appended again as the next index, re-CRC'd, "
        "and committed"),
    "entries_swapped": Case(entries_swapped, _v(
        "corruption/position_mismatch/n2", "divergence/divergent_entry/n2",
        "duplicates/index_repeated/n2", "lost_offsets/index_gap/n2",
        "index_validity/raft_index_mismatch/n2"),
        "n2: two neighbouring entries' bytes swapped"),
    "entries_swapped_renumbered": Case(entries_swapped_renumbered, _v(
        "history/acked_send_misplaced",
        *(f"index_validity/raft_index_mismatch/{n}" for n in _EVERY)),
        "every replica: two neighbouring entries' bodies swapped, headers rewritten in "
        "order, re-CRC'd"),
    "cq_offset_plus_one": Case(cq_offset_plus_one, _v(
        "index_validity/cq_dangling/n1", "index_validity/cq_not_indexed/n1",
        "duplicates/cq_slot_conflict"),
        "n1: a ConsumeQueue unit points one byte past its message"),
    "cq_units_swapped": Case(cq_units_swapped, _v(
        "index_validity/cq_out_of_order/n3", "duplicates/cq_slot_conflict"),
        "n3: two neighbouring units swapped"),
    "cq_wrong_size": Case(cq_wrong_size, _v("index_validity/cq_size_mismatch/n2"),
                          "n2: a unit's size is not its message's"),
    "cq_wrong_tag": Case(cq_wrong_tag, _v("index_validity/cq_tag_mismatch/n2"),
                         "n2: a unit's tag hash is not its message's"),
    "cq_wrong_everywhere": Case(cq_wrong_everywhere, _v(
        *(f"duplicates/indexed_twice/{n}" for n in _EVERY),
        *(f"index_validity/cq_not_indexed/{n}" for n in _EVERY),
        *(f"index_validity/cq_out_of_order/{n}" for n in _EVERY)),
        "every replica: a unit points at the next slot's message (no slot conflict)"),
    "acked_erased_everywhere": Case(acked_erased_everywhere, _v(
        "history/acked_send_missing", "history/consumed_missing",
        *(f"index_validity/cq_dangling/{n}" for n in _EVERY),
        *(f"index_validity/raft_index_mismatch/{n}" for n in _EVERY)),
        "every replica: an acknowledged message's entry rewritten as CONTROL, re-CRC'd"),
    "diverged_term": Case(diverged_term, _v(
        "divergence/divergent_entry/n2", "index_validity/raft_index_mismatch/n2"),
        "n2: one committed entry rewritten with another term, re-CRC'd"),
    "majority_rewrite": Case(majority_rewrite, _v(
        "history/body_mismatch/n2", "history/body_mismatch/n3",
        "divergence/divergent_entry/n2", "divergence/divergent_entry/n3",
        "index_validity/raft_index_mismatch/n2", "index_validity/raft_index_mismatch/n3",
        "lost_offsets/under_replicated"),
        "n2 and n3: one message body rewritten alike, re-CRC'd (the healthy n1 is the "
        "minority)"),
    "minority_rewrite": Case(minority_rewrite, _v(
        "history/body_mismatch/n3", "divergence/divergent_entry/n3",
        "index_validity/raft_index_mismatch/n3"),
        "n3: one message body rewritten, re-CRC'd"),
    "rewrite_everywhere": Case(rewrite_everywhere, _v(
        *(f"history/body_mismatch/{n}" for n in _EVERY),
        *(f"index_validity/raft_index_mismatch/{n}" for n in _EVERY)),
        "every replica: one message body rewritten alike, re-CRC'd"),
    "hardstate_term_max": Case(hardstate_term_max, _v("corruption/implausible_value/n1"),
                               "n1: hardstate term 2^64-1, CRC valid"),
    "hardstate_commit_max": Case(hardstate_commit_max, _v("corruption/implausible_value/n2"),
                                 "n2: hardstate commit 2^64-1, CRC valid"),
    "checkpoint_index_max": Case(checkpoint_index_max, _v("corruption/implausible_value/n3"),
                                 "n3: checkpoint durable index and end 2^64-1, CRC valid"),
    "dispatch_index_max": Case(dispatch_index_max, _v("corruption/implausible_value/n3"),
                               "n3: dispatch checkpoint index 2^64-1, CRC valid"),
    "entry_index_max": Case(entry_index_max, _v(
        "corruption/implausible_value/n2", *(x.format(n="n2") for x in _LOG_CUT)),
        "n2: the last entry's index 2^64-1, re-CRC'd"),
    "entry_term_max": Case(entry_term_max, _v(
        "corruption/implausible_value/n1", *(x.format(n="n1") for x in _LOG_CUT)),
        "n1: the last entry's term 2^64-1, re-CRC'd"),
    "index_record_term_max": Case(index_record_term_max, _v(
        "corruption/implausible_value/n1"), "n1: a Raft-index record's term 2^64-1, re-CRC'd"),
    "cq_offset_max": Case(cq_offset_max, _v(
        "corruption/implausible_value/n2", "lost_offsets/cq_hole/n2",
        "index_validity/cq_not_indexed/n2"),
        "n2: a unit's offset 2^64-1"),
    "identity_damaged": Case(identity_damaged, _v("corruption/bad_identity/n2"),
                             "n2: a byte of IDENTITY's cluster id flipped, CRC stale"),
    "identity_newer_format": Case(identity_newer_format, _v("corruption/unsupported_format/n3"),
                                  "n3: IDENTITY intact but in format version 2"),
    "identity_directory_id_zero": Case(identity_directory_id_zero, _v(
        "corruption/implausible_value/n1"), "n1: IDENTITY's directory id 0, CRC valid"),
    "identity_other_cluster": Case(identity_other_cluster, _v(
        "divergence/identity_cluster_mismatch/n2"), "n2: IDENTITY names another cluster"),
    "identity_directory_copied": Case(identity_directory_copied, _v(
        "divergence/identity_directory_shared/n1", "divergence/identity_directory_shared/n3"),
        "n3: IDENTITY carries n1's directory id (a copied directory)"),
    "identity_node_twice": Case(identity_node_twice, _v(
        "divergence/identity_node_shared/n1", "divergence/identity_node_shared/n3"),
        "n3: IDENTITY says node 1, as n1's does"),
    "zeroed_page": Case(zeroed_page, _v(
        "corruption/bad_magic/n2", "corruption/bad_message/n2", "corruption/body_crc/n2",
        "index_validity/cq_dangling/n2", "lost_offsets/index_gap/n2",
        "lost_offsets/position_gap/n2"),
        "n2: a 4 KiB page of a segment zeroed"),
    "zeroed_page_everywhere": Case(zeroed_page_everywhere, _v(
        *(f"corruption/{k}/{n}" for k in ("bad_magic", "bad_message", "body_crc")
          for n in _EVERY),
        *(f"lost_offsets/{k}/{n}" for k in ("index_gap", "position_gap") for n in _EVERY),
        *(f"index_validity/cq_dangling/{n}" for n in _EVERY),
        "history/acked_send_missing", "history/consumed_missing",
        "lost_offsets/under_replicated"),
        "every replica: the same 4 KiB page zeroed (committed data gone everywhere)"),
}


# ------------------------------------------------------------------ running


def unpack_base(archive: str | Path, dest: str | Path) -> Path:
    """Unpack a recorded base into ``dest``: ``data/<group>/<node>/`` and history.jsonl."""
    dest = Path(dest)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    group = dest / "data" / GROUP
    group.mkdir()
    for node in NODES:
        (dest / "data" / node).rename(group / node)
    return dest


def found_violations(res: AuditResult) -> set[Violation]:
    names = {(r.gid, r.rid): r.name for r in res.replicas}
    return {(r["check"], r["kind"], names.get((r["gid"], r["rid"]), ""))
            for r in res.findings.to_pylist() if r["severity"] == "violation"}


def points_at(res: AuditResult, where: Where, root: Path) -> bool:
    """Some finding of ``where.kind`` on ``where.replica`` at the file/offset/index named."""
    names = {(r.gid, r.rid): r.name for r in res.replicas}
    files = {f.fid: f.path for f in res.files}
    for r in res.findings.to_pylist():
        if r["kind"] != where.kind or names.get((r["gid"], r["rid"]), "") != where.replica:
            continue
        if where.file and os.path.normpath(files.get(r["fid"], "")) != os.path.normpath(
                root / where.replica / where.file):
            continue
        if where.file_offset >= 0 and r["file_offset"] != where.file_offset:
            continue
        if where.index >= 0 and r["index"] != where.index:
            continue
        if where.slot >= 0 and r["slot"] != where.slot:
            continue
        return True
    return False


def audit_case(base: Path, work: Path, case: Case | None, eng: Engine | None = None
               ) -> dict[str, Any]:
    """Copy ``base`` to ``work``, plant ``case`` (None: the clean copy), audit with the
    history, compare. Returns expected and found violations and whether they match."""
    shutil.copytree(base, work)
    group = work / "data" / GROUP
    where = case.plant(group) if case is not None else None
    t0 = time.perf_counter()
    res = run_audit(AuditOptions([str(work / "data")], [str(work / "history.jsonl")]),
                    eng or LocalEngine())
    audit_s = time.perf_counter() - t0
    found = found_violations(res)
    want = case.expect if case is not None else set()
    pointed = where is None or points_at(res, where, group)
    info = {r["kind"] for r in res.findings.to_pylist() if r["severity"] == "info"}
    info_ok = case is None or case.info <= info
    out = {"ok": found == want and pointed and info_ok,
           "expected": sorted("/".join(v).rstrip("/") for v in want),
           "found": sorted("/".join(v).rstrip("/") for v in found),
           "missed": sorted("/".join(v).rstrip("/") for v in want - found),
           "overstated": sorted("/".join(v).rstrip("/") for v in found - want),
           "points_at": None if where is None else {**where.__dict__, "ok": pointed},
           "audit_s": round(audit_s, 4), "findings": res.findings.num_rows}
    out["_result"] = res
    return out
