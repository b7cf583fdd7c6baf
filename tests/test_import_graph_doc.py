"""docs/architecture.md opens with the import graph as it is: the diagram
between its markers is what docs/import_graph.py draws from the code now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_architecture_md_shows_the_current_import_graph() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "docs" / "import_graph.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_drawing_has_every_floor_and_an_arrow_per_import() -> None:
    drawing = subprocess.run([sys.executable, str(ROOT / "docs" / "import_graph.py")],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    assert drawing.startswith("```mermaid\nflowchart TD\n")
    for package in ("ledgermq_cli", "ledgermq_broker", "dledger_runtime", "commitlog",
                    "ledgermq_base"):
        assert f'{package}["' in drawing
    # imports that exist in the code appear; ones that must not exist do not
    assert "consumequeue --> commitlog" in drawing
    from_storage = {line.split("-->")[1].strip() for line in drawing.splitlines()
                    if line.strip().startswith("commitlog -->")}
    assert from_storage == {"ledgermq_base"}
    assert "spark_audit --> commitlog" not in drawing
