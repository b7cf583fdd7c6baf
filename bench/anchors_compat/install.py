"""Put this folder on the development venv's import path (a `.pth` file in
its site-packages), so that the side-by-side kit (`../shared/anchors`),
run with this venv's interpreter as its README says, finds the import
paths its `bench_ledgermq.py` uses (`broker.config`, `broker.launcher`,
`client`, `ledgermq.codes`; see `broker/__init__.py`). Run by `make setup`;
idempotent. Prints the `.pth` file's path."""

from __future__ import annotations

import site
from pathlib import Path

PTH_NAME = "ledgermq-anchors-compat.pth"


def install() -> Path:
    """Write the `.pth` file naming this folder; its path."""
    pth = Path(site.getsitepackages()[0]) / PTH_NAME
    pth.write_text(f"{Path(__file__).resolve().parent}\n")
    return pth


if __name__ == "__main__":
    print(install())
