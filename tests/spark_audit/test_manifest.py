"""The nightly manifest (``manifest``): written atomically, read back exactly, and
refused with a message naming the file when it is damaged, edited or forged."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from spark_audit import manifest
from spark_audit.manifest import Manifest, ManifestError, Part, Span

NIGHT = "20261124T023000Z"


def sample() -> Manifest:
    parts = {"n1": Part(lo=1, entries=63, digest="ab" * 16),
             "n2": Part(lo=10, entries=54, digest="cd" * 16)}
    # Blocks of 64 are index // 64: spans 1..63 and 64..100.
    spans = [Span(lo=1, hi=63, night=NIGHT, night_no=2, verified=1795487400.5, replicas=parts),
             Span(lo=64, hi=100, night=NIGHT, night_no=3, verified=1795487401.0, replicas={})]
    return Manifest(format=1, group="broker-a", block=64, nights=3, verified_through=120,
                    spans=spans, deletions=[manifest.Deletion(index=70, topic="orders")])


def write_doc(state: Path, doc: dict[str, Any], *, reseal: bool = True) -> Path:
    """Write a manifest document, with its sha256 recomputed (a forger's edit) or not."""
    doc = dict(doc)
    if reseal:
        doc.pop("sha256", None)
        doc["sha256"] = hashlib.sha256(manifest.canonical(doc)).hexdigest()
    path = state / "manifest" / "broker-a.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_a_manifest_reads_back_as_written(tmp_path) -> None:
    m = sample()
    path = manifest.save(str(tmp_path), m)
    assert manifest.load(str(tmp_path), "broker-a") == m
    assert manifest.load(str(tmp_path), "other") is None
    assert os.listdir(Path(path).parent) == ["broker-a.json"]  # no temporary file left
    assert m.entries() == 100


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(verified_through=10**6), "does not match its sha256"),
    (lambda d: d["spans"][0]["replicas"]["n1"].update(digest="ef" * 16),
     "does not match its sha256"),
])
def test_an_edited_manifest_is_refused(tmp_path, edit, message) -> None:
    path = Path(manifest.save(str(tmp_path), sample()))
    doc = json.loads(path.read_text())
    edit(doc)
    write_doc(tmp_path, doc, reseal=False)
    with pytest.raises(ManifestError, match=message) as err:
        manifest.load(str(tmp_path), "broker-a")
    assert str(path) in str(err.value)


def _span(d: dict[str, Any], k: int = 0) -> dict[str, Any]:
    span: dict[str, Any] = d["spans"][k]
    return span


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(format=2), "format"),
    (lambda d: d.update(group="broker-b"), "is group 'broker-b'"),
    (lambda d: d.update(block=100), "power of two"),
    (lambda d: d.update(verified_through=50), "past verified_through"),
    (lambda d: d.update(nights=True), "nights"),
    (lambda d: d.update(extra=1), "extra"),
    (lambda d: _span(d, 1).update(lo=60), "overlaps"),
    (lambda d: _span(d, 1).update(hi=130), "crosses a block"),
    (lambda d: _span(d, 1).update(lo=101), "ends before it starts"),
    (lambda d: _span(d).update(lo=0), "greater than or equal to 1"),
    (lambda d: _span(d).update(hi=1 << 63), "less than or equal to"),
    (lambda d: _span(d).update(night="yesterday"), "pattern"),
    (lambda d: _span(d).update(night_no=9), "night 9 of 3"),
    (lambda d: _span(d).update(verified="now"), "verified"),
    (lambda d: _span(d)["replicas"]["n1"].update(entries=62), "does not fit"),
    (lambda d: _span(d)["replicas"]["n1"].update(digest="XYZ"), "pattern"),
    (lambda d: _span(d)["replicas"].update({"../x": _span(d)["replicas"]["n1"]}),
     "replica name"),
    (lambda d: d["deletions"][0].update(topic=""), "at least 1 character"),
    (lambda d: d.pop("deletions"), "deletions"),
])
def test_a_resealed_manifest_that_breaks_the_schema_is_refused(tmp_path, edit,
                                                               message) -> None:
    doc = json.loads(Path(manifest.save(str(tmp_path), sample())).read_text())
    edit(doc)
    path = write_doc(tmp_path, doc)
    with pytest.raises(ManifestError, match=message) as err:
        manifest.load(str(tmp_path), "broker-a")
    assert str(path) in str(err.value)


@pytest.mark.parametrize("raw", [
    b"", b"{", b"[1, 2]", b'{"sha256": 5}', b"\xff\xfe", b'{"a": 1, "a": 2, "sha256": "x"}',
    b'{"verified": NaN, "sha256": "x"}',
])
def test_a_damaged_manifest_is_refused(tmp_path, raw) -> None:
    path = tmp_path / "manifest" / "broker-a.json"
    path.parent.mkdir()
    path.write_bytes(raw)
    with pytest.raises(ManifestError, match=r"manifest .*broker-a\.json") as err:
        manifest.load(str(tmp_path), "broker-a")
    assert "JSON" in str(err.value) or "sha256" in str(err.value)


def test_names_that_are_no_file_names_are_refused(tmp_path) -> None:
    for bad in ("../etc", ".hidden", "a/b", ""):
        with pytest.raises(ManifestError):
            manifest.path_of(str(tmp_path), bad)


KEY = b"manifest-key-0123456789abcdef"


def test_a_keyed_manifest_reads_back_only_with_its_key(tmp_path) -> None:
    m = sample()
    path = Path(manifest.save(str(tmp_path), m, KEY))
    doc = json.loads(path.read_text())
    assert "hmac_sha256" in doc and "sha256" not in doc
    assert manifest.load(str(tmp_path), "broker-a", KEY) == m
    with pytest.raises(ManifestError, match="sealed with a manifest key"):
        manifest.load(str(tmp_path), "broker-a")
    with pytest.raises(ManifestError, match="does not match its hmac_sha256"):
        manifest.load(str(tmp_path), "broker-a", b"another-key-0123456789abcdef")


def test_a_forger_without_the_key_is_refused(tmp_path) -> None:
    """Digests rewritten and the document resealed as a forger can: with a plain
    SHA-256 (what an unkeyed manifest carries), or with an HMAC under a guessed key."""
    doc = json.loads(Path(manifest.save(str(tmp_path), sample(), KEY)).read_text())
    doc.pop("hmac_sha256")
    doc["spans"][0]["replicas"]["n1"]["digest"] = "ef" * 16
    write_doc(tmp_path, doc)  # resealed with sha256
    with pytest.raises(ManifestError, match="not sealed with the manifest key"):
        manifest.load(str(tmp_path), "broker-a", KEY)
    doc["hmac_sha256"] = manifest.seal(manifest.canonical(doc), b"guessed-key-0123456789ab")[1]
    write_doc(tmp_path, doc, reseal=False)
    with pytest.raises(ManifestError, match="does not match its hmac_sha256"):
        manifest.load(str(tmp_path), "broker-a", KEY)


@pytest.mark.parametrize("seals", [{}, {"sha256": "00", "hmac_sha256": "00"},
                                   {"hmac_sha256": 5}])
def test_a_manifest_without_exactly_one_seal_is_refused(tmp_path, seals) -> None:
    doc = json.loads(Path(manifest.save(str(tmp_path), sample())).read_text())
    doc.pop("sha256")
    doc.update(seals)
    write_doc(tmp_path, doc, reseal=False)
    for key in (None, KEY):
        with pytest.raises(ManifestError, match="not one seal"):
            manifest.load(str(tmp_path), "broker-a", key)


def test_a_manifest_that_is_no_regular_file_is_refused_unread(tmp_path) -> None:
    """A link to /dev/zero (which stat says is empty) or a FIFO (which would
    block the reader) in the manifest's place is refused, naming the file."""
    path = tmp_path / "manifest" / "broker-a.json"
    path.parent.mkdir()
    path.symlink_to("/dev/zero")
    with pytest.raises(ManifestError, match=r"broker-a\.json: cannot be read: not a regular file"):
        manifest.load(str(tmp_path), "broker-a")
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ManifestError, match="not a regular file"):
        manifest.load(str(tmp_path), "broker-a")


def test_a_manifest_over_the_bound_is_refused(tmp_path, monkeypatch) -> None:
    path = Path(manifest.save(str(tmp_path), sample()))
    monkeypatch.setattr(manifest, "MAX_FILE_BYTES", path.stat().st_size - 1)
    with pytest.raises(ManifestError, match="more than"):
        manifest.load(str(tmp_path), "broker-a")
    monkeypatch.setattr(manifest, "MAX_FILE_BYTES", path.stat().st_size)
    assert manifest.load(str(tmp_path), "broker-a") == sample()
