"""read_small_file: what a secret or a configuration file may be."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ledgermq.base.small_file import NotReadable, read_small_file


def test_a_regular_file_is_read_whole_up_to_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_small_file(path, 10) == b"x" * 10
    with pytest.raises(NotReadable, match="more than 9 bytes"):
        read_small_file(path, 9)


@pytest.mark.parametrize("what", ["device", "fifo", "directory", "missing"])
def test_anything_but_a_regular_file_is_refused_unread(tmp_path: Path, what: str) -> None:
    path = {"device": Path("/dev/zero"), "fifo": tmp_path / "p", "directory": tmp_path,
            "missing": tmp_path / "nothing"}[what]
    if what == "fifo":
        os.mkfifo(path)  # opening it would block until a writer came
    with pytest.raises(NotReadable,
                       match="No such file" if what == "missing" else "not a regular file"):
        read_small_file(path, 1 << 20)


def test_the_mode_check_sees_the_mode_and_its_refusal_comes_through(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"secret")
    seen: list[int] = []

    def refuse(mode: int) -> None:
        seen.append(mode)
        raise PermissionError("too open")

    path.chmod(0o644)
    with pytest.raises(PermissionError, match="too open"):
        read_small_file(path, 100, refuse)
    assert seen and seen[0] & 0o777 == 0o644
