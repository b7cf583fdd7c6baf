"""The newcomer-path CLI tests: `ledgermq` run as a user runs it (a
subprocess of `python -m ledgermq.cli`), against one real local cluster with
its admin apps on (tests/ops' OpsCluster), shared by the tests of this folder."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ops.support import OpsCluster

from ledgermq.broker.launcher import REPO


def ledgermq(*args: str, columns: int = 200, cwd: Path | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """One `ledgermq ...` run; its exit code, stdout and stderr."""
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS=str(columns))
    return subprocess.run([sys.executable, "-m", "ledgermq.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=cwd or REPO)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsCluster]:
    c = OpsCluster(tmp_path_factory.mktemp("cli") / "cluster")
    c.start()
    try:
        yield c
    finally:
        c.stop()
