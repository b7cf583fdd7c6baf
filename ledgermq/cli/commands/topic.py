"""`ledgermq topic create|update|delete|list|describe`: topics through the
admin API (the NameServer's app forwards writes to every group's leader)."""

from __future__ import annotations

from typing import Any

import typer

from ledgermq.cli.commands.status import ADMIN_OPTION, NAMESRV_OPTION

TOKEN_OPTION = typer.Option("", "--token", envvar="LEDGERMQ_ADMIN_TOKEN",
                            help="Admin token (needed for writes when one is configured).")

topic_app = typer.Typer(help="Create, change, delete, list and describe topics.",
                        no_args_is_help=True)


def call(admin: str, method: str, path: str, body: Any = None, token: str = "") -> Any:
    """An admin API call; its error printed and exit status 1 on failure."""
    from ledgermq.base import loop
    from ledgermq.webadmin.app import AdminApiError, api_call

    try:
        return loop.run(api_call(admin, method, path, body, token))
    except AdminApiError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


@topic_app.command("create")
def create(
    topic: str,
    queues: int = typer.Option(4, min=1, max=1024, help="Number of queues."),
    perm: int = typer.Option(6, min=0, max=6, help="Permission bits: 4 read, 2 write."),
    group: str = typer.Option("", help="Only this broker group (default: every group)."),
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION, namesrv: str = NAMESRV_OPTION,
) -> None:
    """Create (or replace) a topic on every broker group."""
    if namesrv:
        from ledgermq.base import loop
        from ledgermq.client import Producer

        async def main() -> dict:
            async with Producer(namesrv.split(",")) as producer:
                return await producer.create_topic(topic, queues, perm)

        made = loop.run(main())
        typer.echo(f"topic {made['topic']}: {made['queues']} queues, perm {made['perm']}")
        return
    body: dict[str, Any] = {"topic": topic, "queues": queues, "perm": perm}
    if group:
        body["group"] = group
    result = call(admin, "POST", "topics", body, token)
    for name, cfg in sorted(result.get("groups", {"": result}).items()):
        typer.echo(f"topic {topic} on {name or cfg.get('group')}: {cfg['queues']} queues,"
                   f" perm {cfg['perm']}")


@topic_app.command("update")
def update(
    topic: str,
    queues: int = typer.Option(None, min=1, max=1024, help="New queue count (grow only)."),
    perm: int = typer.Option(None, min=0, max=6, help="New permission bits."),
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
) -> None:
    """Grow a topic's queues or change its permissions."""
    body = {k: v for k, v in (("queues", queues), ("perm", perm)) if v is not None}
    result = call(admin, "PUT", f"topics/{_quote(topic)}", body, token)
    for name, cfg in sorted(result.get("groups", {"": result}).items()):
        typer.echo(f"topic {topic} on {name or cfg.get('group')}: {cfg['queues']} queues,"
                   f" perm {cfg['perm']}")


@topic_app.command("delete")
def delete(topic: str, admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION) -> None:
    """Delete a topic's configuration (its messages stay until retention)."""
    call(admin, "DELETE", f"topics/{_quote(topic)}", None, token)
    typer.echo(f"topic {topic} deleted")


async def wire_topics(namesrv: str) -> list[dict[str, Any]]:
    """The admin API's topic list, built over the wire protocol instead."""
    from ledgermq.client.admin import Admin

    async with Admin(namesrv.split(",")) as admin:
        topics = await admin.topics()
    out = []
    for name, groups in sorted(topics.items()):
        for group, cfg in sorted(groups.items()):
            offsets = cfg.get("offsets", [])
            out.append({"topic": name, "group": group, "queues": cfg["queues"],
                        "perm": cfg["perm"], "messages": sum(hi - lo for lo, hi in offsets),
                        "queue_offsets": [{"queue_id": q, "min_offset": lo, "max_offset": hi}
                                          for q, (lo, hi) in enumerate(offsets)]})
    return out


@topic_app.command("list")
def list_topics(admin: str = ADMIN_OPTION, namesrv: str = NAMESRV_OPTION) -> None:
    """List topics with their queue counts and message totals."""
    from rich.console import Console
    from rich.table import Table

    from ledgermq.base import loop

    topics = loop.run(wire_topics(namesrv)) if namesrv else call(admin, "GET", "topics")["topics"]
    table = Table(title="Topics")
    for column in ("topic", "group", "queues", "perm", "messages"):
        table.add_column(column)
    for t in topics:
        table.add_row(t["topic"], t["group"], str(t["queues"]), str(t["perm"]),
                      str(t["messages"]))
    Console().print(table)


@topic_app.command("describe")
def describe(topic: str, admin: str = ADMIN_OPTION, namesrv: str = NAMESRV_OPTION) -> None:
    """Queues of one topic with their min/max offsets."""
    from rich.console import Console
    from rich.table import Table

    from ledgermq.base import loop

    if namesrv:
        groups = {t["group"]: t for t in loop.run(wire_topics(namesrv)) if t["topic"] == topic}
        if not groups:
            typer.echo(f"topic {topic!r} does not exist", err=True)
            raise typer.Exit(1)
    else:
        result = call(admin, "GET", f"topics/{_quote(topic)}")
        groups = result.get("groups") or {result["group"]: result}
    table = Table(title=f"Topic {topic}")
    for column in ("group", "queue", "min offset", "max offset", "perm"):
        table.add_column(column)
    for group, cfg in sorted(groups.items()):
        for q in cfg["queue_offsets"]:
            table.add_row(group, str(q["queue_id"]), str(q["min_offset"]),
                          str(q["max_offset"]), str(cfg["perm"]))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(topic_app, name="topic")
