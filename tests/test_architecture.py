"""The consensus core stays sans-I/O: it never opens a file.

Which modules the core may import (no asyncio, socket, time, random,
threading, os, storage or ledgermq) is the `sans-io-core` import contract in
pyproject.toml, run by `make test`. A call to the builtin `open` needs no
import, so this test walks the AST of every module of `election/` and of
`dledger/`'s state machine (everything but `dledger/runtime/` and the
simulators in `dledger/testing/`) for it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def core_modules() -> list[Path]:
    paths = sorted((ROOT / "election").rglob("*.py"))
    for path in sorted((ROOT / "dledger").rglob("*.py")):
        if path.relative_to(ROOT / "dledger").parts[0] not in ("testing", "runtime"):
            paths.append(path)
    return paths


def open_calls(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name == "open":
                lines.append(node.lineno)
    return lines


def test_core_modules_found() -> None:
    names = {p.name for p in core_modules()}
    assert {"elector.py", "raw_node.py", "log.py", "storage.py", "invariants.py"} <= names
    assert "node.py" not in names


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_core_never_opens_a_file(path: Path) -> None:
    lines = open_calls(ast.parse(path.read_text(), filename=str(path)))
    assert not lines, f"{path.relative_to(ROOT)} calls open() at lines {lines}"


def test_checker_catches_an_open_call() -> None:
    assert open_calls(ast.parse("x = 1\nwith open('x') as f:\n    pass\n")) == [2]
