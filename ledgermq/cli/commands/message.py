"""`ledgermq message get ID` / `ledgermq message find --topic T --key K`:
committed messages looked up through the admin API, by offset message id
(`<group>@<16 hex digits>`, what `send` prints) or by key (a bounded scan of
the newest messages; docs/operations.md)."""

from __future__ import annotations

from typing import Any

import typer

from ledgermq.cli.admin_api import (
    ACCESS_KEY_OPTION,
    ADMIN_OPTION,
    SECRET_FILE_OPTION,
    TLS_CA_OPTION,
    call,
    quote,
    target,
)
from ledgermq.cli.output import OUTPUT_OPTION, Output

message_app = typer.Typer(help="Look committed messages up by id or by key.",
                          no_args_is_help=True)

# What a person wants to see of a message, in this order; -o json has it all.
FIELDS = ("msg_id", "topic", "queue_id", "queue_offset", "tags", "keys", "properties",
          "body_size", "body_text", "born_timestamp_ms", "store_timestamp_ms", "born_host",
          "reconsume_times")


@message_app.command("get")
def get(msg_id: str = typer.Argument(..., help="Message id, as `send` prints it."),
        admin: str = ADMIN_OPTION, output: Output = OUTPUT_OPTION,
        access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
        tls_ca_file: str = TLS_CA_OPTION) -> None:
    """One message by its id: its queue, offset, tags, keys, body and times."""
    from ledgermq.cli.output import console, print_json, table

    message = call(target(admin, access_key, secret_file, tls_ca_file=tls_ca_file), "GET",
                   f"messages/{quote(msg_id)}")
    if output is Output.json:
        print_json(message)
        return
    t = table(f"Message {msg_id}", ("field", "value"), keep=("field",))
    for name in FIELDS:
        value = message.get(name)
        if name == "body_text" and value is None:
            name, value = "body_base64", message.get("body_base64")
        t.add_row(name, _text(value))
    console().print(t)


@message_app.command("find")
def find(topic: str = typer.Option(..., help="Topic to search."),
         key: str = typer.Option(..., help="A key the message was sent with."),
         limit: int = typer.Option(32, min=1, max=1000, help="At most this many messages."),
         admin: str = ADMIN_OPTION, output: Output = OUTPUT_OPTION,
         access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
         tls_ca_file: str = TLS_CA_OPTION) -> None:
    """Messages of a topic sent with a key, newest first."""
    from ledgermq.cli.output import console, print_json, table

    answer = call(target(admin, access_key, secret_file, tls_ca_file=tls_ca_file), "GET",
                  "messages", query={"topic": topic, "key": key, "limit": limit})
    if output is Output.json:
        print_json(answer)
        return
    found = answer["messages"]
    t = table(f"Messages of {topic} with key {key}: {len(found)}",
              ("msg id", "queue", "offset", "tags", "stored (ms)", "body"), keep=("msg id",))
    for m in found:
        body = m["body_text"] if m.get("body_text") is not None else f"<{m['body_size']} bytes>"
        t.add_row(m["msg_id"], str(m["queue_id"]), str(m["queue_offset"]), m.get("tags") or "",
                  str(m["store_timestamp_ms"]), body)
    out = console()
    out.print(t)
    if not answer.get("complete", True):
        out.print(f"the scan stopped after {answer.get('scanned')} messages: older ones"
                  " were not searched")


def _text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
    return "" if value is None else str(value)


def register(app: typer.Typer) -> None:
    app.add_typer(message_app, name="message")
