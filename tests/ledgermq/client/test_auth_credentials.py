"""The SDK's credentials from the environment (LEDGERMQ_ACCESS_KEY and
LEDGERMQ_SECRET_FILE)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ledgermq.client import Credentials, credentials_from_env
from ledgermq.wire.auth import SecretFileError, write_secret_file


def test_credentials_from_env(tmp_path: Path) -> None:
    secret = write_secret_file(tmp_path / "app.secret")
    env = {"LEDGERMQ_ACCESS_KEY": "app", "LEDGERMQ_SECRET_FILE": str(tmp_path / "app.secret")}
    assert credentials_from_env(env) == Credentials("app", secret)
    assert credentials_from_env({}) is None
    with pytest.raises(ValueError, match="set together"):
        credentials_from_env({"LEDGERMQ_ACCESS_KEY": "app"})
    os.chmod(tmp_path / "app.secret", 0o644)
    with pytest.raises(SecretFileError, match="chmod 600"):
        credentials_from_env(env)


def test_credentials_from_the_process_environment(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    secret = write_secret_file(tmp_path / "s")
    monkeypatch.setenv("LEDGERMQ_ACCESS_KEY", "app")
    monkeypatch.setenv("LEDGERMQ_SECRET_FILE", str(tmp_path / "s"))
    assert credentials_from_env() == Credentials("app", secret)
