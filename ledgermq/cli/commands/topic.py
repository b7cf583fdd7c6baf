"""`ledgermq topic create|update|delete|list|describe`: topics through the
admin API (the NameServer's app forwards writes to every group's leader), or
over the wire protocol with `--namesrv`."""

from __future__ import annotations

from typing import Any

import typer

from ledgermq.cli.admin_api import (
    ACCESS_KEY_OPTION,
    ADMIN_OPTION,
    NAMESRV_OPTION,
    SECRET_FILE_OPTION,
    TLS_CA_OPTION,
    TOKEN_OPTION,
    call,
    quote,
    target,
)
from ledgermq.cli.output import OUTPUT_OPTION, Output

topic_app = typer.Typer(help="Create, change, delete, list and describe topics.",
                        no_args_is_help=True)


def _print_configs(topic: str, result: dict[str, Any]) -> None:
    """A write's answer: the NameServer's is per group, a broker's is one config."""
    for name, cfg in sorted(result.get("groups", {"": result}).items()):
        typer.echo(f"topic {topic} on {name or cfg.get('group')}: {cfg['queues']} queues,"
                   f" perm {cfg['perm']}")


@topic_app.command("create")
def create(
    topic: str,
    queues: int = typer.Option(4, min=1, max=1024, help="Number of queues."),
    perm: int = typer.Option(6, min=0, max=6, help="Permission bits: 4 read, 2 write."),
    group: str = typer.Option("", help="Only this broker group (default: every group)."),
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION, namesrv: str = NAMESRV_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
) -> None:
    """Create (or replace) a topic on every broker group."""
    if namesrv:
        from ledgermq.base import loop
        from ledgermq.cli.wire_security import client_security
        from ledgermq.client import Producer

        security = client_security(access_key, secret_file, tls_ca_file)

        async def main() -> dict[str, Any]:
            async with Producer(namesrv.split(","), **security) as producer:
                return await producer.create_topic(topic, queues, perm)

        made = loop.run(main())
        typer.echo(f"topic {made['topic']}: {made['queues']} queues, perm {made['perm']}")
        return
    body: dict[str, Any] = {"topic": topic, "queues": queues, "perm": perm}
    if group:
        body["group"] = group
    to = target(admin, access_key, secret_file, token, tls_ca_file)
    _print_configs(topic, call(to, "POST", "topics", body))


@topic_app.command("update")
def update(
    topic: str,
    queues: int = typer.Option(None, min=1, max=1024, help="New queue count (grow only)."),
    perm: int = typer.Option(None, min=0, max=6, help="New permission bits."),
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
) -> None:
    """Grow a topic's queues or change its permissions."""
    body = {k: v for k, v in (("queues", queues), ("perm", perm)) if v is not None}
    to = target(admin, access_key, secret_file, token, tls_ca_file)
    _print_configs(topic, call(to, "PUT", f"topics/{quote(topic)}", body))


@topic_app.command("delete")
def delete(topic: str, admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
           access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
           tls_ca_file: str = TLS_CA_OPTION) -> None:
    """Delete a topic's configuration (its messages stay until retention)."""
    call(target(admin, access_key, secret_file, token, tls_ca_file), "DELETE",
         f"topics/{quote(topic)}")
    typer.echo(f"topic {topic} deleted")


async def wire_topics(namesrv: str, security: dict[str, Any]) -> list[dict[str, Any]]:
    """The admin API's topic list, built over the wire protocol instead
    (`security`: ledgermq.cli.wire_security.client_security's)."""
    from ledgermq.client.admin import Admin

    async with Admin(namesrv.split(","), **security) as admin:
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
def list_topics(admin: str = ADMIN_OPTION, namesrv: str = NAMESRV_OPTION,
                output: Output = OUTPUT_OPTION, access_key: str = ACCESS_KEY_OPTION,
                secret_file: str = SECRET_FILE_OPTION,
                tls_ca_file: str = TLS_CA_OPTION) -> None:
    """List topics with their queue counts and message totals."""
    from ledgermq.base import loop
    from ledgermq.cli.output import console, print_json, table
    from ledgermq.cli.wire_security import client_security

    to = target(admin, access_key, secret_file, tls_ca_file=tls_ca_file)
    topics = (loop.run(wire_topics(namesrv, client_security(access_key, secret_file,
                                                            tls_ca_file)))
              if namesrv else call(to, "GET", "topics")["topics"])
    if output is Output.json:
        print_json({"topics": topics})
        return
    t = table("Topics", ("topic", "group", "queues", "perm", "messages"), keep=("topic", "group"))
    for row in topics:
        t.add_row(row["topic"], row["group"], str(row["queues"]), str(row["perm"]),
                  str(row["messages"]))
    console().print(t)


@topic_app.command("describe")
def describe(topic: str, admin: str = ADMIN_OPTION, namesrv: str = NAMESRV_OPTION,
             output: Output = OUTPUT_OPTION, access_key: str = ACCESS_KEY_OPTION,
             secret_file: str = SECRET_FILE_OPTION, tls_ca_file: str = TLS_CA_OPTION) -> None:
    """Queues of one topic with their min/max offsets."""
    from ledgermq.base import loop
    from ledgermq.cli.errors import fail
    from ledgermq.cli.output import console, print_json, table

    if namesrv:
        from ledgermq.cli.wire_security import client_security

        security = client_security(access_key, secret_file, tls_ca_file)
        groups = {t["group"]: t for t in loop.run(wire_topics(namesrv, security))
                  if t["topic"] == topic}
        if not groups:
            raise fail(f"topic {topic!r} does not exist")
    else:
        result = call(target(admin, access_key, secret_file, tls_ca_file=tls_ca_file), "GET",
                      f"topics/{quote(topic)}")
        groups = result.get("groups") or {result["group"]: result}
    if output is Output.json:
        print_json({"topic": topic, "groups": groups})
        return
    t = table(f"Topic {topic}", ("group", "queue", "min offset", "max offset", "perm"),
              keep=("group",))
    for group, cfg in sorted(groups.items()):
        for q in cfg["queue_offsets"]:
            t.add_row(group, str(q["queue_id"]), str(q["min_offset"]), str(q["max_offset"]),
                      str(cfg["perm"]))
    console().print(t)


def register(app: typer.Typer) -> None:
    app.add_typer(topic_app, name="topic")
