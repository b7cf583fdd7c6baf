"""`ledgermq send TOPIC [BODY ...]`: send messages and print where they went."""

from __future__ import annotations

import typer

from ledgermq.cli.admin_api import ACCESS_KEY_OPTION, SECRET_FILE_OPTION, TLS_CA_OPTION

BODIES = typer.Argument(None, help="Message bodies (default: 'hello N').")


def register(app: typer.Typer) -> None:
    @app.command("send")
    def send(
        topic: str,
        bodies: list[str] = BODIES,
        count: int = typer.Option(1, min=1, help="Messages to send when no body is given."),
        tags: str = typer.Option("", help="Tag of every message."),
        keys: str = typer.Option("", help="Keys, space separated."),
        sharding_key: str = typer.Option(None, help="Same key -> same queue (ordering)."),
        namesrv: str = typer.Option(
            "127.0.0.1:9876", help="NameServer address(es), comma separated."),
        access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
        tls_ca_file: str = TLS_CA_OPTION,
    ) -> None:
        """Send messages (synchronously acknowledged) to a topic."""
        from ledgermq.base import loop
        from ledgermq.cli.wire_security import client_security
        from ledgermq.client import Producer

        security = client_security(access_key, secret_file, tls_ca_file)
        messages = [b.encode() for b in bodies] if bodies else [
            b"hello %d" % i for i in range(count)]

        async def main() -> None:
            async with Producer(namesrv.split(","), **security) as producer:
                for body in messages:
                    r = await producer.send(topic, body, tags=tags, keys=keys,
                                            sharding_key=sharding_key)
                    typer.echo(f"{r.msg_id} queue {r.queue.queue_id} offset {r.queue_offset}")

        loop.run(main())  # a failure is printed as one line by ledgermq.cli.errors
