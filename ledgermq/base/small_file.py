"""Reading a small file a user named (a secret, a configuration): only a
regular file, and only up to a bound, so that a wrong path such as
/dev/zero or a FIFO is refused instead of read until memory runs out or
blocking for ever."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable


class NotReadable(ValueError):
    """Why the file was not read; the message is the reason alone (callers
    say which file and what it was meant to be)."""


def read_small_file(path: str | os.PathLike[str], max_bytes: int,
                    check_mode: Callable[[int], None] | None = None) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` of them.
    `check_mode(st_mode)` runs before anything is read and may raise its own
    error (a secret file readable by others is refused unread)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise NotReadable(exc.strerror or str(exc)) from None
    if not stat.S_ISREG(mode):
        raise NotReadable("not a regular file")
    if check_mode is not None:
        check_mode(mode)
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise NotReadable(exc.strerror or str(exc)) from None
    if len(data) > max_bytes:
        raise NotReadable(f"more than {max_bytes} bytes")
    return data
