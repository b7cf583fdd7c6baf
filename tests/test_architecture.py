"""The consensus core stays sans-I/O: no sockets, files, clocks, threads or randomness of its own.

Walks the AST of every module of election/ and of dledger/'s state machine
(everything but the asyncio driver `dledger/node.py`, `dledger/runtime*.py`
and the test support in `dledger/testing/`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"asyncio", "socket", "time", "random", "threading", "os"}


def core_modules() -> list[Path]:
    paths = sorted((ROOT / "election").rglob("*.py"))
    for path in sorted((ROOT / "dledger").rglob("*.py")):
        rel = path.relative_to(ROOT / "dledger")
        if rel.parts[0] == "testing" or rel.name == "node.py" or rel.name.startswith("runtime"):
            continue
        paths.append(path)
    return paths


def imported_roots(tree: ast.AST) -> set[str]:
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_modules_found() -> None:
    names = {p.name for p in core_modules()}
    assert {"elector.py", "raw_node.py", "log.py", "storage.py", "invariants.py"} <= names


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_io_in_core(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = imported_roots(tree) & FORBIDDEN
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            assert name != "open", f"{path.relative_to(ROOT)}:{node.lineno} calls open()"


def test_checker_catches_violations() -> None:
    tree = ast.parse("import os\nfrom time import monotonic\nopen('x')\n")
    assert imported_roots(tree) & FORBIDDEN == {"os", "time"}
