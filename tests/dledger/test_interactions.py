"""Runs the etcd-style interaction transcripts in testdata/.

Set LEDGERMQ_REWRITE=1 to regenerate the expected output in place; review the
diff before committing it ("only commit the changes if you understand what
caused them").
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dledger.testing.interaction import run_transcript

TESTDATA = Path(__file__).parent / "testdata"
REWRITE = os.environ.get("LEDGERMQ_REWRITE", "") not in ("", "0")


@pytest.mark.parametrize("path", sorted(TESTDATA.glob("*.txt")), ids=lambda p: p.stem)
def test_transcript(path: Path) -> None:
    text = path.read_text()
    rewritten, results = run_transcript(text)
    if REWRITE:
        path.write_text(rewritten)
        return
    for command, want, got in results:
        assert got == want, f"{path.name}: command {command!r}\n--- want\n{want}\n--- got\n{got}"
