"""Fixtures for CommitLog tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def data_dir(tmp_path) -> str:
    return os.fspath(tmp_path / "node")
