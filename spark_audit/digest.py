"""Digests of index spans, per replica: what the nightly manifest remembers.

A span's digest on one replica is BLAKE2b-128 over that replica's entry rows
with index in the span, each as ``(index, term, position, size, body_crc)``
(little-endian, 32 bytes), sorted by those fields. It binds every entry's
place in the log and the CRC of its body, so a later re-read that differs
in any entry, including a rewrite made consistently on every replica with
its CRCs recomputed (which every cross-replica check accepts), gives another
digest. Both engines compute it from the same rows: the in-process engine
from each replica's entry array, the distributed one inside the pass-1
reduce call of the index range holding the span (``dlog``), so only the
digests reach the driver. Spans never cross a multiple of their block size
(``split``), and the block size divides ``dlog.LOG_CHUNK``, so one reduce
call sees all of a span.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from spark_audit import checks

# Spans are cut at multiples of the block (a power of two dividing dlog.LOG_CHUNK).
DEFAULT_BLOCK = 1 << 16
MAX_BLOCK = 1 << 19
DIGEST_DTYPE = np.dtype([("index", "<i8"), ("term", "<i8"), ("position", "<i8"),
                         ("size", "<i4"), ("body_crc", "<u4")])
EMPTY = hashlib.blake2b(b"", digest_size=16).hexdigest()

Span = tuple[int, int]


@dataclass(frozen=True)
class Plan:
    """Which spans of one group to digest: ``spans`` as given, and, when ``open_from``
    is set, every index from there to the group's claimed commit (its largest
    hardstate commit, after a cut), split at multiples of ``block``."""

    spans: tuple[Span, ...] = ()
    open_from: int = 0
    block: int = DEFAULT_BLOCK


def check_block(block: int) -> int:
    """``block`` if it is a power of two dividing ``MAX_BLOCK``, else ``ValueError``."""
    if not (1 <= block <= MAX_BLOCK and block & (block - 1) == 0):
        raise ValueError(f"digest block {block} must be a power of two up to {MAX_BLOCK}")
    return block


def split(lo: int, hi: int, block: int) -> list[Span]:
    """``lo..hi`` cut at every multiple of ``block`` (each piece within one block)."""
    out = []
    while lo <= hi:
        end = min(hi, (lo // block + 1) * block - 1)
        out.append((lo, end))
        lo = end + 1
    return out


def plan_spans(plan: Plan, st: checks.GroupState) -> list[Span]:
    """The spans ``plan`` names for a group whose small files were read (and window
    placed): the open part starts no lower than the lowest first index on disk."""
    spans = list(plan.spans)
    if plan.open_from:
        commits = [m.hardstate.commit for m in st.replicas.values() if m.hardstate]
        firsts = [m.disk_first[0] for m in st.replicas.values() if m.disk_first]
        lo = max(plan.open_from, min(firsts, default=1))
        spans += split(lo, max(commits, default=0), check_block(plan.block))
    return sorted(set(spans))


def of_rows(rows: np.ndarray) -> tuple[int, str]:
    """(entries, digest) of entry rows (any structured array with the digest's fields)."""
    r = np.empty(len(rows), DIGEST_DTYPE)
    for name in DIGEST_DTYPE.names or ():
        r[name] = rows[name]
    if len(r) > 1 and not bool((np.diff(r["index"]) > 0).all()):
        r = np.sort(r, order=list(DIGEST_DTYPE.names or ()))
    return len(r), hashlib.blake2b(r.tobytes(), digest_size=16).hexdigest()


def of_spans(rows: np.ndarray, spans: list[Span]) -> list[tuple[int, str]]:
    """(entries, digest) of the rows in each span (inclusive index ranges)."""
    idx = rows["index"]
    if len(idx) > 1 and not bool((np.diff(idx) >= 0).all()):
        order = np.argsort(idx, kind="stable")
        rows, idx = rows[order], idx[order]
    out = []
    for lo, hi in spans:
        a, b = np.searchsorted(idx, lo, "left"), np.searchsorted(idx, hi, "right")
        out.append(of_rows(rows[a:b]))
    return out
