"""`ledgermq consume TOPIC --group G`: print messages as a push consumer gets them."""

from __future__ import annotations

from typing import Any

import typer

from ledgermq.cli.admin_api import ACCESS_KEY_OPTION, SECRET_FILE_OPTION, TLS_CA_OPTION
from ledgermq.cli.errors import fail


def register(app: typer.Typer) -> None:
    @app.command("consume")
    def consume(
        topic: str,
        group: str = typer.Option("cli-consumer", help="Consumer group."),
        tags: str = typer.Option("*", help="Tag expression: '*' or 'a||b'."),
        count: int = typer.Option(0, min=0, help="Stop after this many messages (0: never)."),
        timeout: float = typer.Option(0.0, min=0, help="Stop after this many idle seconds."),
        mode: str = typer.Option("clustering", help="clustering or broadcasting."),
        namesrv: str = typer.Option(
            "127.0.0.1:9876", help="NameServer address(es), comma separated."),
        access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
        tls_ca_file: str = TLS_CA_OPTION,
    ) -> None:
        """Consume a topic and print each message (offsets committed as it goes)."""
        import asyncio
        import time

        from ledgermq.base import loop
        from ledgermq.cli.wire_security import client_security
        from ledgermq.client import PushConsumer

        security = client_security(access_key, secret_file, tls_ca_file)
        seen = 0
        done = asyncio.Event()
        last = time.monotonic()

        def handle(message: Any) -> None:
            nonlocal seen, last
            seen += 1
            last = time.monotonic()
            body = message.body.decode(errors="replace")
            typer.echo(f"{message.msg_id} q{message.queue_id}@{message.queue_offset}"
                       f" tags={message.tags!r} {body}")
            if count and seen >= count:
                done.set()

        try:  # a malformed name is refused here, before any connection
            consumer = PushConsumer(namesrv.split(","), group, topic, handle, tags=tags,
                                    mode=mode, **security)
        except ValueError as exc:
            raise fail(str(exc)) from None

        async def main() -> int:
            await consumer.start()
            try:
                while not done.is_set():
                    if timeout and time.monotonic() - last > timeout:
                        break
                    await asyncio.sleep(0.1)
            finally:
                await consumer.stop()
            return seen

        try:
            seen = loop.run(main())
        except KeyboardInterrupt:
            raise typer.Exit(0) from None
        typer.echo(f"consumed {seen} messages", err=True)
