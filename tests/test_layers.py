"""The import graph is the architecture (../shared/DESIGN.md): each top-level
package may import only the project packages listed for it here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = {"ledgermq", "election", "dledger", "commitlog", "consumequeue", "broker", "namesrv",
           "client", "chaos", "spark_audit"}

# package -> project packages it may import. `ledgermq` is the shared layer
# (wire framing, codes, CLI); its `commands` subpackage is the CLI, which may
# reach everything, so it is checked separately below.
ALLOWED = {
    "commitlog": set(),
    "consumequeue": {"commitlog"},
    "election": set(),
    "dledger": {"election", "commitlog", "ledgermq"},
    "namesrv": {"ledgermq"},
    "broker": {"ledgermq", "commitlog", "consumequeue", "dledger", "election", "namesrv"},
    "client": {"ledgermq"},
    "chaos": {"ledgermq", "client", "dledger", "commitlog", "spark_audit"},
    # The audit has its own reader of docs/storage-format.md: it must not
    # import the storage code it checks.
    "spark_audit": {"ledgermq"},
    "ledgermq": set(),
}


def project_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & PROJECT


def modules() -> list[tuple[str, Path]]:
    out = []
    for package in sorted(ALLOWED):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT / package)
            if package == "ledgermq" and (rel.parts[0] == "commands" or rel.name == "cli.py"):
                continue
            out.append((package, path))
    return out


def allowed(package: str, path: Path) -> set[str]:
    """dledger's state machine may use election only; its runtime (node.py,
    runtime_*.py) and simulator (testing/) may use the storage and the wire."""
    if package == "dledger":
        rel = path.relative_to(ROOT / "dledger")
        if not (rel.parts[0] == "testing" or rel.name == "node.py"
                or rel.name.startswith("runtime")):
            return {"election"}
    return ALLOWED[package]


@pytest.mark.parametrize(("package", "path"), modules(),
                         ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, Path) else v)
def test_package_imports_only_what_the_architecture_allows(package: str, path: Path) -> None:
    bad = project_imports(path) - allowed(package, path) - {package}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_nothing_imports_chaos_or_the_audit() -> None:
    for package, path in modules():
        if package in ("chaos", "spark_audit"):
            continue
        used = project_imports(path) & {"chaos", "spark_audit"}
        assert not used, f"{path.relative_to(ROOT)} imports {sorted(used)}"


def test_the_checker_sees_imports() -> None:
    sample = ROOT / "consumequeue" / "store.py"
    assert "commitlog" in project_imports(sample)
