"""The import contracts (pyproject.toml, [tool.importlinter]) catch what they
claim to: `make test` runs `lint-imports` on the tree, and these tests plant a
wrong import in a copy of it and check that the contract it breaks says so."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ledgermq", "election", "dledger", "commitlog", "consumequeue", "chaos",
            "spark_audit")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_copy(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """Copy the product's packages and pyproject.toml, append `line` to
    `module`'s file and run lint-imports on the copy."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = tmp_path / module.replace(".", "/") / "__init__.py"
    path.write_text(path.read_text() + f"\n{line}\n")
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tmp_path, capture_output=True,
                          text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          timeout=300)


@pytest.mark.parametrize(("module", "line", "contract"), [
    # a floor importing upward: storage reaching the CLI
    ("commitlog.segments", "import ledgermq.cli", "Floors"),
    # siblings on one floor: the client SDK reaching into the broker
    ("ledgermq.client.producer", "from ledgermq.broker import state", "Floors"),
    # the audit reading storage through the code it audits
    ("spark_audit.parse", "import commitlog.entry", "The audit reads storage-format.md"),
    # a clock in the consensus core
    ("dledger.raw_node", "import time", "sans-I/O"),
    # a module cycle inside one package
    ("ledgermq.wire.codec", "import ledgermq.wire.rpc", "No import cycles"),
], ids=["upward", "siblings", "audit", "sans-io", "cycle"])
def test_a_planted_wrong_import_breaks_its_contract(tmp_path: Path, module: str, line: str,
                                                     contract: str) -> None:
    result = lint_copy(tmp_path, module, line)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout


def test_the_copy_of_the_tree_is_clean_without_a_planted_import(tmp_path: Path) -> None:
    """The planted tests fail because of what they plant, not because of the copy."""
    result = lint_copy(tmp_path, "commitlog.segments", "# nothing planted")
    assert result.returncode == 0, result.stdout + result.stderr
