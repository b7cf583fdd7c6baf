"""`ledgermq retention show|trim`: retention and disk usage through the admin API.

`show` lists every node of every group (retention is per replica: each has
its own disk, snapshot and first retained entry); `trim` is the operator's
"delete up to": the group's leader proposes the trim point through the log,
and each replica deletes the whole segments below it once a local snapshot
covers them (docs/operations.md, "Retention").
"""

from __future__ import annotations

import time
from typing import Any

import typer

from ledgermq.cli.admin_api import (
    ACCESS_KEY_OPTION,
    ADMIN_OPTION,
    SECRET_FILE_OPTION,
    TLS_CA_OPTION,
    TOKEN_OPTION,
    call,
    target,
)
from ledgermq.cli.output import OUTPUT_OPTION, Output

retention_app = typer.Typer(help="Retention: disk usage, retained log range, manual trim.",
                            no_args_is_help=True)


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _age(ms: int | None, now_ms: int) -> str:
    """How long ago `ms` was, in the largest unit that fits."""
    if ms is None:
        return "-"
    seconds = max(0, (now_ms - ms) // 1000)
    for unit, length in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= length:
            return f"{seconds // length}{unit}"
    return f"{seconds}s"


def nodes_of(answer: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(group, node answer) rows from a NameServer's or a broker's answer."""
    if "groups" in answer:
        return [(name, node) for name, group in sorted(answer["groups"].items())
                for node in group.get("nodes", [])]
    return [(answer.get("group", "?"), answer)]


@retention_app.command("show")
def show(
    group: str = typer.Option("", help="Only this broker group."),
    admin: str = ADMIN_OPTION, output: Output = OUTPUT_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
) -> None:
    """Per node: disk usage, log size, first/last retained index, the age of
    the oldest retained message, the newest snapshot and whether writes are
    refused (disk above disk_hard_ratio)."""
    from ledgermq.cli.output import console, print_json, table

    answer = call(target(admin, access_key, secret_file, tls_ca_file=tls_ca_file), "GET",
                  "retention", query={"group": group} if group else None)
    if output is Output.json:
        print_json(answer)
        return
    now = int(time.time() * 1000)
    t = table("Retention", ("group", "node", "role", "disk", "log", "first", "last",
                            "oldest", "snapshot", "writes"), keep=("group", "node", "role"))
    settings: dict[str, Any] | None = None
    for name, node in nodes_of(answer):
        node_id = str(node.get("node_id", "?"))
        if "error" in node:
            t.add_row(name, node_id, "-", "-", "-", "-", "-", "-", "-",
                      str(node["error"].get("code", "error")))
            continue
        settings = settings or node["settings"]
        disk, kept, snap = node["disk"], node["retained"], node["snapshot"]
        t.add_row(name, node_id, node.get("role", "?"),
                  f"{disk['usage_ratio']:.0%} of {_size(disk['total_bytes'])}",
                  f"{_size(disk['log_bytes'])} / {disk['segments']} seg",
                  str(kept["first_index"]), str(kept["last_index"]),
                  _age(kept.get("first_time_ms"), now),
                  str(snap["index"]) if snap else "none",
                  "REFUSED" if disk.get("refusing_writes") else "ok")
    console().print(t)
    if settings is not None:
        typer.echo(f"retention_hours={settings['retention_hours']:g}"
                   f" retention_bytes={settings['retention_bytes']}"
                   f" disk_soft_ratio={settings['disk_soft_ratio']:g}"
                   f" disk_hard_ratio={settings['disk_hard_ratio']:g}")


@retention_app.command("trim")
def trim(
    index: int | None = typer.Option(None, "--index", min=0,
                              help="Entries below this Raft index may go."),
    position: int | None = typer.Option(None, "--position", min=0,
                                 help="Or: CommitLog bytes below this position may go."),
    group: str = typer.Option("", help="Broker group (default: the only one registered)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the point; propose nothing."),
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION, output: Output = OUTPUT_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
) -> None:
    """Delete up to an index (or position): the leader proposes the trim
    point; whole segments below it go on each replica once its own snapshot
    covers them (never the last segment, never past the last applied entry)."""
    from ledgermq.cli.errors import fail
    from ledgermq.cli.output import print_json

    if (index is None) == (position is None):
        raise fail("give exactly one of --index and --position")
    body: dict[str, Any] = {"dry_run": dry_run}
    body.update({"index": index} if index is not None else {"position": position})
    if group:
        body["group"] = group
    answer = call(target(admin, access_key, secret_file, token, tls_ca_file), "POST",
                  "retention/trim", body)
    if output is Output.json:
        print_json(answer)
        return
    what = "would propose" if answer.get("dry_run") else "proposed"
    if answer["position"] <= answer["previous_trim"]:
        what = "already agreed:"
    line = (f"group {answer.get('group', group)}: {what} trim point {answer['position']}"
            f" ({answer['segments']} segment(s), {_size(answer['bytes'])})")
    if answer.get("clamped"):
        line += "; clamped to the segment of the last applied entry"
    if answer.get("waiting_for"):
        line += f"; the leader's deletion waits for its {answer['waiting_for']}"
    typer.echo(line)


def register(app: typer.Typer) -> None:
    app.add_typer(retention_app, name="retention")
