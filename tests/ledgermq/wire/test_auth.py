"""The AUTH handshake's building blocks: proofs bind everything they cover,
and secret files are refused when others may read them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ledgermq.wire import auth

SECRET = b"s" * 32


def test_a_proof_verifies_only_for_what_it_covers() -> None:
    challenge, nonce = auth.new_challenge(), auth.new_challenge()
    proof = auth.client_proof(SECRET, challenge, nonce, "client:app")
    assert auth.proof_matches(auth.client_proof(SECRET, challenge, nonce, "client:app"), proof)
    for other in (auth.client_proof(b"t" * 32, challenge, nonce, "client:app"),
                  auth.client_proof(SECRET, auth.new_challenge(), nonce, "client:app"),
                  auth.client_proof(SECRET, challenge, auth.new_challenge(), "client:app"),
                  auth.client_proof(SECRET, challenge, nonce, "broker:app"),
                  auth.server_proof(SECRET, challenge, nonce, "client:app")):
        assert not auth.proof_matches(other, proof)


def test_parts_are_length_prefixed() -> None:
    c = auth.new_challenge()
    assert auth.client_proof(SECRET, c, b"ab", "c") != auth.client_proof(SECRET, c, b"a", "bc")


@pytest.mark.parametrize("got", [None, "text", b"", b"x" * 31, 12])
def test_anything_but_the_right_bytes_fails(got: object) -> None:
    assert not auth.proof_matches(b"x" * 32, got)


def test_credentials_never_print_their_secret() -> None:
    creds = auth.Credentials("app", SECRET)
    assert "sss" not in repr(creds)
    with pytest.raises(ValueError):
        auth.Credentials("app", b"short")
    with pytest.raises(ValueError):
        auth.Credentials("", SECRET)


def test_secret_files(tmp_path: Path) -> None:
    path = tmp_path / "cluster.secret"
    written = auth.write_secret_file(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert auth.read_secret_file(path) == written
    with pytest.raises(FileExistsError):
        auth.write_secret_file(path)
    os.chmod(path, 0o644)
    with pytest.raises(auth.SecretFileError, match="chmod 600"):
        auth.read_secret_file(path)
    short = tmp_path / "short"
    auth.write_secret_file(short, b"abc")
    with pytest.raises(auth.SecretFileError, match="at least"):
        auth.read_secret_file(short)
    with pytest.raises(auth.SecretFileError, match="cannot read"):
        auth.read_secret_file(tmp_path / "missing")
    # A wrong path is refused before anything is read: /dev/zero (mode 0666)
    # used to be read to the end of memory before its mode was looked at.
    for not_a_file in ("/dev/zero", str(tmp_path)):
        with pytest.raises(auth.SecretFileError, match="not a regular file"):
            auth.read_secret_file(not_a_file)
    large = tmp_path / "large"
    auth.write_secret_file(large, b"k" * (auth.SECRET_FILE_BYTES_MAX + 1))
    with pytest.raises(auth.SecretFileError, match="more than 4096 bytes"):
        auth.read_secret_file(large)
    padded = tmp_path / "padded"
    auth.write_secret_file(padded, b"  " + written + b"\n")
    assert auth.read_secret_file(padded) == written
