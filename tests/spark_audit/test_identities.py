"""The audit's reading of IDENTITY files (``fmt.parse_identity``) and its
cross-check of a group's identities (``spark_audit.identities``).

The audit transcribes the format on its own (it imports nothing of the
broker), so the first tests hold it to what the broker really writes and
refuses: every file the broker's ``open_identity`` writes decodes to the same
fields, and every truncation and every flipped byte of one is refused by both.
The planted suite (test_planted.py) covers the same findings end to end on a
real run's replicas.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.runtime.identity import IdentityError, decode_identity, open_identity
from spark_audit import fmt, identities, inputs
from spark_audit.checks import INFO, VIOLATION, Findings, GroupState, ReplicaMeta


def _broker_identity(tmp_path: Path, cluster: str = "prod-east", node: int = 7) -> bytes:
    opened = open_identity(str(tmp_path), cluster, node)
    raw = (tmp_path / "IDENTITY").read_bytes()
    assert opened.identity.directory_id > 0
    return raw


def test_the_audit_decodes_what_the_broker_writes(tmp_path: Path) -> None:
    raw = _broker_identity(tmp_path, "prod-east-ü", 7)
    ident = fmt.parse_identity(raw)
    theirs = decode_identity("IDENTITY", raw)
    assert (ident.cluster_id, ident.node_id, ident.directory_id) == (
        theirs.cluster_id, theirs.node_id, theirs.directory_id) == (
        "prod-east-ü", 7, theirs.directory_id)
    assert fmt.encode_identity(ident) == raw


def test_every_truncation_and_flipped_byte_is_refused_by_audit_and_broker(tmp_path: Path) -> None:
    raw = _broker_identity(tmp_path)
    damaged = [raw[:n] for n in range(len(raw))]
    for at in range(len(raw)):
        for mask in (0x01, 0x80):
            flipped = bytearray(raw)
            flipped[at] ^= mask
            damaged.append(bytes(flipped))
    damaged.append(raw + b"\0")
    for bad in damaged:
        with pytest.raises(fmt.FormatError):
            fmt.parse_identity(bad)
        with pytest.raises(IdentityError):
            decode_identity("IDENTITY", bad)


def test_an_intact_newer_format_is_named_as_such_not_as_damage() -> None:
    raw = fmt.encode_identity(fmt.Identity(1, 5, 0, "c"), version=fmt.FORMAT_VERSION + 1)
    with pytest.raises(fmt.UnsupportedFormat, match="format version 2"):
        fmt.parse_identity(raw)


@pytest.mark.parametrize("field", ["node_id", "directory_id"])
def test_an_identity_number_out_of_range_is_implausible(field: str) -> None:
    for value in (0, 1 << 63, (1 << 64) - 1):
        fields = {"node_id": 1, "directory_id": 2, "created_ms": 0, "cluster_id": "c",
                  field: value}
        with pytest.raises(fmt.ImplausibleValue, match=field):
            fmt.parse_identity(fmt.encode_identity(fmt.Identity(**fields)))


def _group(idents: dict[str, fmt.Identity | None]) -> tuple[dict[int, GroupState],
                                                             list[inputs.FileInfo]]:
    state = GroupState(0, "g", {})
    files = []
    for rid, (name, ident) in enumerate(idents.items()):
        state.replicas[rid] = ReplicaMeta(rid, name, identity=ident)
        if ident is not None:
            files.append(inputs.FileInfo(fid=rid, gid=0, rid=rid, path=f"/d/{name}/IDENTITY",
                                         kind=inputs.IDENTITY, start=0, length=40))
    return {0: state}, files


def _findings(idents: dict[str, fmt.Identity | None]) -> set[tuple[str, str, str]]:
    groups, files = _group(idents)
    out = Findings()
    identities.check(groups, files, out)
    names = {rid: m.name for rid, m in groups[0].replicas.items()}
    return {(r["kind"], r["severity"], names[r["rid"]]) for r in out.rows}


def _id(node: int, directory: int, cluster: str = "c") -> fmt.Identity:
    return fmt.Identity(node, directory, 0, cluster)


def test_a_consistent_group_has_no_finding() -> None:
    assert _findings({"a": _id(1, 11), "b": _id(2, 12), "c": _id(3, 13)}) == set()


def test_a_replica_without_identity_is_info() -> None:
    assert _findings({"a": _id(1, 11), "b": None}) == {("no_identity", INFO, "b")}


def test_the_odd_cluster_out_is_flagged_and_a_tie_flags_both() -> None:
    assert _findings({"a": _id(1, 11), "b": _id(2, 12, "x"), "c": _id(3, 13)}) == {
        ("identity_cluster_mismatch", VIOLATION, "b")}
    assert _findings({"a": _id(1, 11, "x"), "b": _id(2, 12, "y")}) == {
        ("identity_cluster_mismatch", VIOLATION, "a"),
        ("identity_cluster_mismatch", VIOLATION, "b")}


def test_a_copied_directory_flags_every_holder_of_its_ids() -> None:
    # A whole directory copied: the same node id and the same directory id.
    assert _findings({"a": _id(1, 11), "b": _id(1, 11), "c": _id(3, 13)}) == {
        ("identity_node_shared", VIOLATION, "a"), ("identity_node_shared", VIOLATION, "b"),
        ("identity_directory_shared", VIOLATION, "a"),
        ("identity_directory_shared", VIOLATION, "b")}
