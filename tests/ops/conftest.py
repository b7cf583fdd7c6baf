"""One running 3-node group + NameServer (all admin apps on) shared by the API
and metrics tests of this tier; the browser test starts its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ops.support import OpsCluster, SecureOpsCluster


def _write_reports(root: Path) -> None:
    run = root / "chaos-2024-01-01T00-00-00"
    run.mkdir(parents=True)
    (run / "results.json").write_text('{"valid": true, "workload": "queue", "ops": 1200}')
    (run / "index.html").write_text("<html><body>chaos run</body></html>")
    (root / "audit-broker-a.json").write_text('{"ok": true}')


@pytest.fixture(scope="session")
def ops_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsCluster]:
    base = tmp_path_factory.mktemp("ops")
    reports = base / "reports"
    _write_reports(reports)
    cluster = OpsCluster(base / "cluster", reports_dir=reports)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureOpsCluster]:
    """A 3-node group + NameServer with authentication on and HTTPS admin apps."""
    cluster = SecureOpsCluster(tmp_path_factory.mktemp("secure") / "cluster")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
