"""The side-by-side kit (`../shared/anchors`) imports LedgerMQ by the paths
it was written against, before the layout change; the development venv
(`make setup`) must answer them with the real modules, from any directory,
as the kit runs from its own folder with this venv's interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# bench_ledgermq.py's imports, as the kit has them.
KIT_IMPORTS = """
from broker.config import Peer, render_config
from broker.launcher import node_status
from client import Producer
from ledgermq.codes import RequestCode
from ledgermq.wire import RpcClient
"""

SAME_OBJECTS = """
import ledgermq.base.codes, ledgermq.broker.config, ledgermq.broker.launcher, ledgermq.client
assert Peer is ledgermq.broker.config.Peer
assert render_config is ledgermq.broker.config.render_config
assert node_status is ledgermq.broker.launcher.node_status
assert Producer is ledgermq.client.Producer
assert RequestCode is ledgermq.base.codes.RequestCode
import client, broker.config
assert client is ledgermq.client and broker.config is ledgermq.broker.config
print("same")
"""


def test_the_kits_import_paths_are_the_real_modules(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", KIT_IMPORTS + SAME_OBJECTS], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (
        f"{done.stderr[-2000:]}\n(the venv lacks bench/anchors_compat: `make setup` runs"
        " bench/anchors_compat/install.py)")
    assert done.stdout.strip() == "same"


def test_the_product_never_imports_the_old_paths() -> None:
    """The aliases serve the kit only: product code, tests and scripts use
    `ledgermq.*` (a stray `import client` would work in the dev venv alone)."""
    offenders = []
    for path in REPO.rglob("*.py"):
        rel = path.relative_to(REPO)
        if (rel.parts[0] in {".venv", "build"} or rel.parts[:2] == ("bench", "anchors_compat")
                or path == Path(__file__).resolve()):
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in {"import", "from"} and (
                    words[1].split(".")[0] in {"broker", "client"}
                    or words[1] == "ledgermq.codes"):
                offenders.append(f"{rel}: {line.strip()}")
    assert not offenders, offenders
