"""`ledgermq group list|describe|reset`: consumer groups through the admin API."""

from __future__ import annotations

import typer

from ledgermq.cli.commands.status import ADMIN_OPTION
from ledgermq.cli.commands.topic import TOKEN_OPTION, _quote, call

group_app = typer.Typer(help="Consumer groups: lag, members, offset resets.",
                        no_args_is_help=True)


@group_app.command("list")
def list_groups(admin: str = ADMIN_OPTION) -> None:
    """Consumer groups with their topics, online members and total lag."""
    from rich.console import Console
    from rich.table import Table

    groups = call(admin, "GET", "consumer-groups")["consumer_groups"]
    table = Table(title="Consumer groups")
    for column in ("group", "topics", "members", "lag"):
        table.add_column(column)
    for g in groups:
        table.add_row(g["group"], ", ".join(g["topics"]), str(g["members"]), str(g["lag"]))
    Console().print(table)


@group_app.command("describe")
def describe(group: str, admin: str = ADMIN_OPTION) -> None:
    """Committed offset and lag of every queue a group consumes."""
    from rich.console import Console
    from rich.table import Table

    info = call(admin, "GET", f"consumer-groups/{_quote(group)}")
    table = Table(title=f"Consumer group {group}: lag {info['lag']},"
                        f" {len(info['members'])} member(s)")
    for column in ("topic", "broker group", "queue", "committed", "max offset", "lag"):
        table.add_column(column)
    for topic, queues in sorted(info["topics"].items()):
        for q in queues:
            table.add_row(topic, q["broker_group"], str(q["queue_id"]), str(q["offset"]),
                          str(q["max_offset"]), str(q["lag"]))
    Console().print(table)


@group_app.command("reset")
def reset(
    group: str,
    topic: str = typer.Option(..., help="Topic whose offsets move."),
    timestamp_ms: int = typer.Option(
        ..., "--timestamp-ms", help="Epoch ms: restart at the first message stored then."),
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
) -> None:
    """Reset a group's offsets of a topic to a time (stop its consumers first:
    a running consumer commits its own position again)."""
    result = call(admin, "POST", f"consumer-groups/{_quote(group)}/reset-offsets",
                  {"topic": topic, "timestamp_ms": timestamp_ms}, token)
    for name, answer in sorted(result.get("groups", {"": result}).items()):
        offsets = ", ".join(f"q{o['queue_id']}={o['offset']}" for o in answer["offsets"])
        typer.echo(f"{group} on {name or 'this group'}: {offsets}")


def register(app: typer.Typer) -> None:
    app.add_typer(group_app, name="group")
