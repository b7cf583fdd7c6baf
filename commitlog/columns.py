"""The record heads of a MESSAGES entry body as numpy columns, in one pass.

Every replica walks every committed entry twice (state-machine apply and
ConsumeQueue dispatch) and the leader walks every request once more to check
it. A Python loop over records costs a tuple, a few slices and a few dict
operations per message, which on a 2-core machine is a large share of the
broker's CPU; `scan_body` instead walks only the size chain in Python (the one
part that is inherently sequential), gathers the fixed 68-byte heads with one
numpy fancy-index, and answers the per-record questions (topic, tag hash) per
distinct value rather than per record when the records agree, as the records
of one producer batch or one group commit almost always do.

The result is the same as walking `message.iter_records`: the same errors for
a malformed body (ValueError), the same fields.

numpy's fixed cost per call (a microsecond or more each, a dozen calls per
scan) is what a body of one or a few records pays most, and one message per
request is the normal case of independent producers. Bodies of at most
`PYTHON_SCAN_MAX` records are therefore scanned in plain Python, which
builds the same columns with three array constructions; anything unusual on
that path (a malformed body, a non-UTF-8 topic) hands the body to the numpy
path, so errors are raised by one code only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from crc32c import crc32c

from ledgermq.base.message_record import MESSAGE_HEAD, MESSAGE_HEAD_SIZE

# The packed numpy twin of MESSAGE_HEAD ("<IIIIqqQQIHHHHII").
HEAD_DTYPE = np.dtype([
    ("size", "<u4"), ("queue_id", "<u4"), ("flag", "<u4"), ("sys_flag", "<u4"),
    ("born", "<i8"), ("store", "<i8"), ("producer_id", "<u8"), ("sequence", "<u8"),
    ("reconsume", "<u4"), ("topic_len", "<u2"), ("tags_len", "<u2"), ("keys_len", "<u2"),
    ("host_len", "<u2"), ("props_len", "<u4"), ("body_len", "<u4"),
])
assert HEAD_DTYPE.itemsize == MESSAGE_HEAD_SIZE == MESSAGE_HEAD.size
_HEAD_COLUMNS = np.arange(MESSAGE_HEAD_SIZE, dtype=np.int64)
_SIZE = struct.Struct("<I").unpack_from
_UNPACK_HEAD = MESSAGE_HEAD.unpack_from
STORE_TIMESTAMP_AT = 24  # byte offset of the store timestamp inside a head
# Bodies of at most this many records take the plain-Python scan (measured
# break-even with the numpy path: about 8 records of one size, more when
# they differ).
PYTHON_SCAN_MAX = 8


# ((topic, queue id), the rows of that queue, or None for every row).
QueueGroups = list[tuple[tuple[str, int], list[int] | None]]


@dataclass(slots=True)
class RecordColumns:
    """One column per head field of interest, one row per record, in body order."""

    starts: np.ndarray       # int64: record start, relative to the body
    heads: np.ndarray        # HEAD_DTYPE: every head field
    topics: list[str]        # distinct topics, first-seen order
    topic_ids: np.ndarray    # int64 index into `topics`, per record
    tag_hashes: np.ndarray   # uint64 CRC32C of the tags (0: none), per record
    groups: QueueGroups | None = None  # queue_groups(), computed once
    # Every record has the first one's topic, tags, keys, born host and
    # properties (so checking the first checks them all).
    same_meta: bool = False
    # The heads as Python tuples (MESSAGE_HEAD's field order) when the
    # plain-Python scan made them (at most PYTHON_SCAN_MAX records): whoever
    # reads a few records' fields reads them here, not through numpy.
    rows: list[tuple[int, ...]] | None = None

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def sizes(self) -> np.ndarray:
        return self.heads["size"]

    @property
    def queue_ids(self) -> np.ndarray:
        return self.heads["queue_id"]



def _walk(body: bytes | bytearray | memoryview, raw: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray | None]:
    """(record starts, the body as an (n, size) matrix when every record has
    the same size, else None). Uniform sizes, the common case, are checked by
    numpy; otherwise the size chain is followed in Python."""
    end = len(body)
    if end < MESSAGE_HEAD_SIZE:
        raise ValueError(f"truncated message head at body offset 0 ({end} bytes)")
    first = _SIZE(body, 0)[0]
    if first >= MESSAGE_HEAD_SIZE and end % first == 0:
        matrix = raw.reshape(end // first, first)
        if (matrix[:, :4].view("<u4")[:, 0] == first).all():
            return np.arange(0, end, first, dtype=np.int64), matrix
    found: list[int] = []
    append = found.append
    offset = 0
    while offset < end:
        if end - offset < MESSAGE_HEAD_SIZE:
            raise ValueError(f"truncated message head at body offset {offset}")
        size = _SIZE(body, offset)[0]
        if size < MESSAGE_HEAD_SIZE or offset + size > end:
            raise ValueError(f"message size {size} inconsistent at body offset {offset}")
        append(offset)
        offset += size
    return np.array(found, dtype=np.int64), None


def _strings(body: bytes | bytearray | memoryview, raw: np.ndarray, matrix: np.ndarray | None,
             starts: np.ndarray, at: np.ndarray, lengths: np.ndarray
             ) -> tuple[list[bytes], np.ndarray]:
    """Distinct byte strings body[start+at : start+at+length] and each record's
    index among them; one numpy comparison when all records carry the same."""
    first_at, first_len = int(at[0]), int(lengths[0])
    first = bytes(body[first_at : first_at + first_len])  # starts[0] is 0
    n = len(starts)
    if (lengths == first_len).all() and (at == first_at).all():
        if first_len == 0:
            return [first], np.zeros(n, dtype=np.int64)
        if matrix is not None:
            region = matrix[:, first_at : first_at + first_len]
        else:
            region = raw[(starts + first_at)[:, None] + np.arange(first_len, dtype=np.int64)]
        if (region == np.frombuffer(first, dtype=np.uint8)).all():
            return [first], np.zeros(n, dtype=np.int64)
    distinct: dict[bytes, int] = {}
    ids = np.empty(n, dtype=np.int64)
    for i, (s, a, k) in enumerate(zip(starts.tolist(), at.tolist(), lengths.tolist(),
                                      strict=True)):
        value = bytes(body[s + a : s + a + k])
        j = distinct.get(value)
        if j is None:
            j = distinct[value] = len(distinct)
        ids[i] = j
    return list(distinct), ids


def _same_meta(body: bytes | bytearray | memoryview, matrix: np.ndarray, starts: np.ndarray
               ) -> RecordColumns | None:
    """The common batch: records of one size whose field lengths, topic, tags,
    keys, born host and properties all equal the first record's. One numpy
    comparison proves it; the first record alone is then checked in Python."""
    head = MESSAGE_HEAD.unpack_from(body, 0)
    meta_end = MESSAGE_HEAD_SIZE + sum(head[9:14])  # through the properties
    if head[0] != MESSAGE_HEAD_SIZE + sum(head[9:15]):
        return None  # let the general path name the bad record
    if len(starts) > 1 and not (matrix[1:, 52:meta_end] == matrix[0, 52:meta_end]).all():
        return None
    n = len(starts)
    at = MESSAGE_HEAD_SIZE + head[9]
    try:
        topic = bytes(body[MESSAGE_HEAD_SIZE:at]).decode()
    except UnicodeDecodeError as exc:
        raise ValueError(f"topic name is not UTF-8: {exc}") from None
    heads = np.ascontiguousarray(matrix[:, :MESSAGE_HEAD_SIZE]).view(HEAD_DTYPE)[:, 0]
    tags = bytes(body[at : at + head[10]])
    hashes = np.full(n, crc32c(tags) if tags else 0, dtype=np.uint64)
    return RecordColumns(starts, heads, [topic], np.zeros(n, dtype=np.int64), hashes,
                         same_meta=True)


def scan_body(body: bytes | bytearray | memoryview,
              python_max: int = PYTHON_SCAN_MAX) -> RecordColumns:
    """Columns of every record of a MESSAGES entry body; ValueError if
    malformed. Bodies of at most `python_max` records are scanned in plain
    Python (the same result; 0 forces numpy)."""
    if python_max:
        small = _scan_small(body, python_max)
        if small is not None:
            return small
    raw = np.frombuffer(body, dtype=np.uint8)
    if not len(raw):
        return RecordColumns(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=HEAD_DTYPE), [],
                             np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64), [])
    starts, matrix = _walk(body, raw)
    if matrix is not None:
        same = _same_meta(body, matrix, starts)
        if same is not None:
            return same
        rows = np.ascontiguousarray(matrix[:, :MESSAGE_HEAD_SIZE])
    else:
        rows = raw[starts[:, None] + _HEAD_COLUMNS]
    heads = rows.view(HEAD_DTYPE)[:, 0]
    # topic, tags, keys and host lengths (u2) then properties and body (u4).
    lengths = (rows[:, 52:60].view("<u2").sum(axis=1, dtype=np.int64)
               + rows[:, 60:68].view("<u4").sum(axis=1, dtype=np.int64))
    bad = np.flatnonzero(heads["size"] != MESSAGE_HEAD_SIZE + lengths)
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"message size {int(heads['size'][i])} inconsistent at body"
                         f" offset {int(starts[i])}")
    topic_len = heads["topic_len"]
    names, topic_ids = _strings(body, raw, matrix, starts,
                                np.full(len(starts), MESSAGE_HEAD_SIZE, dtype=np.int64),
                                topic_len)
    try:
        topics = [name.decode() for name in names]
    except UnicodeDecodeError as exc:
        raise ValueError(f"topic name is not UTF-8: {exc}") from None
    tags_len = heads["tags_len"]
    if not tags_len.any():
        tag_hashes = _zeros_u64(len(starts))
    else:
        tags, tag_ids = _strings(body, raw, matrix, starts,
                                 MESSAGE_HEAD_SIZE + topic_len.astype(np.int64), tags_len)
        hashes = np.array([crc32c(t) if t else 0 for t in tags], dtype=np.uint64)
        tag_hashes = hashes[tag_ids]
    return RecordColumns(starts, heads, topics, topic_ids, tag_hashes)


def _frozen(values: list[int], dtype: type) -> np.ndarray:
    array: np.ndarray = np.array(values, dtype=dtype)
    array.flags.writeable = False
    return array


# Shared by every one-record scan (read-only, so sharing them is safe).
_ONE_START = _frozen([0], np.int64)
_ONE_TOPIC_ID = _ONE_START
_ONE_NO_TAGS = _frozen([0], np.uint64)


def scan_one(body: bytes) -> RecordColumns | None:
    """`scan_body` of a body that is exactly one well-formed record (the
    request of a producer that sends one message at a time)."""
    head = _UNPACK_HEAD(body, 0)
    if head[0] != len(body) or head[0] != MESSAGE_HEAD_SIZE + sum(head[9:15]):
        return None
    at = MESSAGE_HEAD_SIZE + head[9]
    try:
        topic = body[MESSAGE_HEAD_SIZE:at].decode()
    except UnicodeDecodeError:
        return None
    hashes = _ONE_NO_TAGS
    if head[10]:
        hashes = _frozen([crc32c(body[at : at + head[10]])], np.uint64)
    # A view of the immutable body: no copy, and nothing can change it.
    heads = np.frombuffer(body, dtype=HEAD_DTYPE, count=1)
    return RecordColumns(_ONE_START, heads, [topic], _ONE_TOPIC_ID, hashes, same_meta=True,
                         rows=[head])


def _scan_small(body: bytes | bytearray | memoryview, most: int) -> RecordColumns | None:
    """`scan_body` of a body of at most `most` well-formed records, in plain
    Python; None for anything else (more records, a malformed record, a
    topic that is not UTF-8), which the numpy path then scans or refuses."""
    end = len(body)
    if end < MESSAGE_HEAD_SIZE:
        return None
    if type(body) is bytes and _SIZE(body, 0)[0] == end:
        return scan_one(body)
    starts: list[int] = []
    heads: list[tuple[int, ...]] = []
    offset = 0
    while offset < end:
        if len(starts) == most or end - offset < MESSAGE_HEAD_SIZE:
            return None
        head = _UNPACK_HEAD(body, offset)
        size = head[0]
        if offset + size > end or size != MESSAGE_HEAD_SIZE + sum(head[9:15]):
            return None
        starts.append(offset)
        heads.append(head)
        offset += size
    n = len(starts)
    topics: list[str] = []
    topic_ids: list[int] = []
    tags_seen: dict[bytes, int] = {}  # tags -> CRC32C (0: none)
    hashes: list[int] = []
    names: dict[bytes, int] = {}
    first = heads[0]
    meta_end = MESSAGE_HEAD_SIZE + sum(first[9:14])  # through the properties
    first_meta = bytes(body[52:meta_end])
    same = True
    for start, head in zip(starts, heads, strict=True):
        at = start + MESSAGE_HEAD_SIZE
        name = bytes(body[at : at + head[9]])
        index = names.get(name)
        if index is None:
            try:
                topics.append(name.decode())
            except UnicodeDecodeError:
                return None
            index = names[name] = len(names)
        topic_ids.append(index)
        at += head[9]
        tags = bytes(body[at : at + head[10]])
        crc = tags_seen.get(tags)
        if crc is None:
            crc = tags_seen[tags] = crc32c(tags) if tags else 0
        hashes.append(crc)
        if same and start and (head[0] != first[0]
                               or body[start + 52 : start + meta_end] != first_meta):
            same = False
    rows = np.frombuffer(bytearray().join(body[s : s + MESSAGE_HEAD_SIZE] for s in starts),
                         dtype=HEAD_DTYPE)
    return RecordColumns(np.array(starts, dtype=np.int64), rows, topics,
                         np.array(topic_ids, dtype=np.int64),
                         np.array(hashes, dtype=np.uint64), same_meta=same and n > 0,
                         rows=heads)


def _zeros_u64(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.uint64)


_GROUP_IN_PYTHON_MAX = 128


def _groups_of_rows(rows: list[tuple[int, ...]], topics: list[str],
                    topic_ids: np.ndarray) -> QueueGroups:
    """`queue_groups` of a few records whose heads are Python tuples."""
    first = rows[0][1]
    if len(topics) == 1 and all(row[1] == first for row in rows):
        return [((topics[0], first), None)]
    found: dict[tuple[int, int], list[int]] = {}
    for i, (row, t) in enumerate(zip(rows, topic_ids.tolist(), strict=True)):
        members = found.get((t, row[1]))
        if members is None:
            found[(t, row[1])] = [i]
        else:
            members.append(i)
    return [((topics[t], queue_id), members) for (t, queue_id), members in found.items()]


def queue_groups(columns: RecordColumns) -> QueueGroups:
    """((topic, queue id), record numbers in body order) per queue, in order of
    first appearance; None instead of the numbers when one queue has them all."""
    if columns.groups is not None:
        return columns.groups
    groups: QueueGroups
    rows = columns.rows
    if rows is not None:
        columns.groups = groups = _groups_of_rows(rows, columns.topics, columns.topic_ids)
        return groups
    topics, topic_ids, queue_ids = columns.topics, columns.topic_ids, columns.heads["queue_id"]
    n = len(queue_ids)
    if not n:
        groups = []
    elif len(topics) == 1 and (n == 1 or (queue_ids == queue_ids[0]).all()):
        groups = [((topics[0], int(queue_ids[0])), None)]
    elif n > _GROUP_IN_PYTHON_MAX:
        codes = queue_ids.astype(np.int64)
        if len(topics) > 1:
            codes |= topic_ids << 32
        order = np.argsort(codes, kind="stable")
        ordered = codes[order]
        parts = np.split(order, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1)
        parts.sort(key=lambda part: int(part[0]))  # stable: part[0] is its first record
        groups = [((topics[int(topic_ids[part[0]])], int(queue_ids[part[0]])), part.tolist())
                  for part in parts]
    else:
        # A few queues over a few dozen records: grouping a list in Python
        # beats numpy's per-call cost.
        codes = queue_ids.tolist() if len(topics) == 1 else (
            (topic_ids << 32) | queue_ids.astype(np.int64)).tolist()
        found: dict[int, list[int]] = {}
        for i, code in enumerate(codes):
            members = found.get(code)
            if members is None:
                found[code] = [i]
            else:
                members.append(i)
        groups = [((topics[int(topic_ids[m[0]])], int(queue_ids[m[0]])), m)
                  for m in found.values()]
    columns.groups = groups
    return groups
