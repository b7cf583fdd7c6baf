"""`ledgermq group list|describe|reset`: consumer groups through the admin API."""

from __future__ import annotations

from typing import Any

import typer

from ledgermq.cli.admin_api import (
    ACCESS_KEY_OPTION,
    ADMIN_OPTION,
    SECRET_FILE_OPTION,
    TLS_CA_OPTION,
    TOKEN_OPTION,
    call,
    quote,
    target,
)
from ledgermq.cli.output import OUTPUT_OPTION, Output

group_app = typer.Typer(help="Consumer groups: lag, members, offset resets.",
                        no_args_is_help=True)


@group_app.command("list")
def list_groups(admin: str = ADMIN_OPTION, output: Output = OUTPUT_OPTION,
                access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
                tls_ca_file: str = TLS_CA_OPTION) -> None:
    """Consumer groups with their topics, online members and total lag."""
    from ledgermq.cli.output import console, print_json, table

    answer = call(target(admin, access_key, secret_file, tls_ca_file=tls_ca_file), "GET",
                  "consumer-groups")
    if output is Output.json:
        print_json(answer)
        return
    t = table("Consumer groups", ("group", "topics", "members", "lag"), keep=("group",))
    for g in answer["consumer_groups"]:
        t.add_row(g["group"], ", ".join(g["topics"]), str(g["members"]), str(g["lag"]))
    console().print(t)


@group_app.command("describe")
def describe(group: str, admin: str = ADMIN_OPTION, output: Output = OUTPUT_OPTION,
             access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
             tls_ca_file: str = TLS_CA_OPTION) -> None:
    """Committed offset and lag of every queue a group consumes."""
    from ledgermq.cli.output import console, print_json, table

    info = call(target(admin, access_key, secret_file, tls_ca_file=tls_ca_file), "GET",
                f"consumer-groups/{quote(group)}")
    if output is Output.json:
        print_json(info)
        return
    t = table(f"Consumer group {group}: lag {info['lag']}, {len(info['members'])} member(s)",
              ("topic", "broker group", "queue", "committed", "max offset", "lag"),
              keep=("topic", "broker group"))
    for topic, queues in sorted(info["topics"].items()):
        for q in queues:
            t.add_row(topic, q["broker_group"], str(q["queue_id"]), str(q["offset"]),
                      str(q["max_offset"]), str(q["lag"]))
    console().print(t)


@group_app.command("reset")
def reset(
    group: str,
    topic: str = typer.Option(..., help="Topic whose offsets move."),
    timestamp_ms: int = typer.Option(
        None, "--timestamp-ms", help="Epoch ms: restart at the first message stored then."),
    offset: int = typer.Option(
        None, min=0, help="Restart at this queue offset (clamped to each queue's range)."),
    queue: int = typer.Option(None, min=0, help="Only this queue id (default: every queue)."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Print what would change; change nothing."),
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
) -> None:
    """Reset a group's offsets of a topic to a time or an offset (stop its
    consumers first: a running consumer commits its own position again)."""
    from ledgermq.cli.errors import fail

    if (timestamp_ms is None) == (offset is None):
        raise fail("give exactly one of --timestamp-ms and --offset")
    body: dict[str, Any] = {"topic": topic, "dry_run": dry_run}
    if offset is None:
        body["timestamp_ms"] = timestamp_ms
    else:
        body["offset"] = offset
    if queue is not None:
        body["queue_id"] = queue
    result = call(target(admin, access_key, secret_file, token, tls_ca_file), "POST",
                  f"consumer-groups/{quote(group)}/reset-offsets", body)
    for name, answer in sorted(result.get("groups", {"": result}).items()):
        offsets = ", ".join(f"q{o['queue_id']}={o['offset']} (was {_was(o)})"
                            for o in answer["offsets"])
        typer.echo(f"{group} on {name or 'this group'}: {offsets}")
    if dry_run:
        typer.echo("dry run: nothing changed")


def _was(row: dict[str, Any]) -> str:
    """A queue's committed offset before the reset ('none': never committed)."""
    previous = row.get("previous")
    return "none" if previous is None else str(previous)


def register(app: typer.Typer) -> None:
    app.add_typer(group_app, name="group")
