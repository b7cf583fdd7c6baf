"""`ledgermq send TOPIC [BODY ...]`: send messages and print where they went."""

from __future__ import annotations

import typer

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
    ) -> None:
        """Send messages (synchronously acknowledged) to a topic."""
        from ledgermq.base import loop
        from ledgermq.client import Producer

        messages = [b.encode() for b in bodies] if bodies else [
            b"hello %d" % i for i in range(count)]

        async def main() -> None:
            async with Producer(namesrv.split(",")) as producer:
                for body in messages:
                    r = await producer.send(topic, body, tags=tags, keys=keys,
                                            sharding_key=sharding_key)
                    typer.echo(f"{r.msg_id} queue {r.queue.queue_id} offset {r.queue_offset}")

        loop.run(main())  # a failure is printed as one line by ledgermq.cli.errors
