"""The nightly state directory, read back for the cross-night report: every night and the latest.

``ledgermq audit --nightly --state DIR`` writes ``DIR/nights/<night_id>/night.json``
per night and ``DIR/latest.json`` (a copy of the newest one). The format of
those files and the rules for believing one (strict JSON, types, ranges,
names, self-consistency, latest.json being the newest finished night's own
file) are ``ledgermq.base.audit_night``, which the NameServer's reader shares.
What is the report's own is here: it lists every directory under ``nights/``,
oldest first, with its night or the reason it could not be read (a stray
directory, a night that never wrote its file, a forged one), so the report
shows an unreadable night as such, never skips it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ledgermq.base.audit_night import (
    LATEST,
    NIGHT_ID,
    Night,
    NightError,
    night_file,
    read_latest,
    read_night,
)


@dataclass(frozen=True)
class NightRow:
    """A directory under nights/: its night, or why it could not be read."""

    night_id: str
    path: Path  # its night.json
    night: Night | None
    error: str | None


@dataclass(frozen=True)
class State:
    """Everything under a state directory, nights oldest first."""

    directory: Path
    nights: list[NightRow]
    latest: Night | None
    latest_error: str | None  # None also when latest.json is simply absent
    latest_present: bool

    @property
    def readable(self) -> list[Night]:
        return [r.night for r in self.nights if r.night is not None]

    @property
    def last_success(self) -> Night | None:
        """The newest night that passed."""
        return next((n for n in reversed(self.readable) if n.passed), None)


def read_state(state_dir: str | os.PathLike[str]) -> State:
    """Every night under ``state_dir/nights`` (unreadable ones with their reason) and
    ``latest.json``, believed only as the newest finished night's own document."""
    root = Path(state_dir)
    rows: list[NightRow] = []
    nights_dir = root / "nights"
    names = sorted(os.listdir(nights_dir)) if nights_dir.is_dir() else []
    for name in names:
        path = night_file(root, name)
        if not NIGHT_ID.fullmatch(name):
            rows.append(NightRow(name, path, None, f"{nights_dir / name}: not a night id "
                                                   "(YYYYMMDDTHHMMSSZ)"))
            continue
        try:
            rows.append(NightRow(name, path, read_night(path, name), None))
        except NightError as exc:
            rows.append(NightRow(name, path, None, str(exc)))
    by_id = {r.night_id: r for r in rows}

    def own(night_id: str) -> Night:
        """A night as listed above (latest.json is judged against what the page shows)."""
        row = by_id.get(night_id)
        if row is None:
            raise NightError(f"{night_file(root, night_id)}: missing")
        if row.night is None:
            raise NightError(str(row.error))
        return row.night

    latest: Night | None = None
    error: str | None = None
    present = (root / LATEST).exists()
    if present:
        try:
            latest = read_latest(root, own)
        except NightError as exc:
            error = str(exc)
    return State(root, rows, latest, error, present)
