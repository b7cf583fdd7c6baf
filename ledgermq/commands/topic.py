"""`ledgermq topic create|list|describe`: topics through the broker leaders."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

import typer

T = TypeVar("T")

topic_app = typer.Typer(help="Create, list and describe topics.", no_args_is_help=True)

def _run(coro: Coroutine[Any, Any, T]) -> T:
    from ledgermq import loop

    return loop.run(coro)


@topic_app.command("create")
def create(
    topic: str,
    queues: int = typer.Option(4, min=1, max=1024, help="Number of queues."),
    perm: int = typer.Option(6, min=0, max=6, help="Permission bits: 4 read, 2 write."),
    namesrv: str = typer.Option(
            "127.0.0.1:9876", help="NameServer address(es), comma separated."),
) -> None:
    """Create (or update) a topic on every broker group."""
    from client import Producer

    async def main() -> dict:
        async with Producer(namesrv.split(",")) as producer:
            return await producer.create_topic(topic, queues, perm)

    result = _run(main())
    typer.echo(f"topic {result['topic']}: {result['queues']} queues, perm {result['perm']}")


@topic_app.command("list")
def list_topics(namesrv: str = typer.Option(
            "127.0.0.1:9876", help="NameServer address(es), comma separated.")
                ) -> None:
    """List topics with their queue counts and message totals."""
    from rich.console import Console
    from rich.table import Table

    from client.admin import Admin

    async def main() -> dict:
        async with Admin(namesrv.split(",")) as admin:
            return await admin.topics()

    topics = _run(main())
    table = Table(title="Topics")
    for column in ("topic", "group", "queues", "perm", "messages"):
        table.add_column(column)
    for name, groups in sorted(topics.items()):
        for group, cfg in sorted(groups.items()):
            total = sum(hi - lo for lo, hi in cfg.get("offsets", []))
            table.add_row(name, group, str(cfg["queues"]), str(cfg["perm"]), str(total))
    Console().print(table)


@topic_app.command("describe")
def describe(topic: str,
             namesrv: str = typer.Option(
            "127.0.0.1:9876", help="NameServer address(es), comma separated.")) -> None:
    """Queues of one topic with their min/max offsets."""
    from rich.console import Console
    from rich.table import Table

    from client.admin import Admin

    async def main() -> dict:
        async with Admin(namesrv.split(",")) as admin:
            return await admin.topics()

    groups = _run(main()).get(topic)
    if not groups:
        typer.echo(f"topic {topic!r} does not exist", err=True)
        raise typer.Exit(1)
    table = Table(title=f"Topic {topic}")
    for column in ("group", "queue", "min offset", "max offset", "perm"):
        table.add_column(column)
    for group, cfg in sorted(groups.items()):
        for q, (lo, hi) in enumerate(cfg.get("offsets", [])):
            table.add_row(group, str(q), str(lo), str(hi), str(cfg["perm"]))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(topic_app, name="topic")
