"""`ledgermq broker --config FILE`: run one broker node.

Prints `broker listening on HOST:PORT` once clients can connect (scripts and
the local-cluster launcher wait for that line), stops cleanly on Ctrl-C or
SIGTERM with exit status 0.
"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("broker")
    def broker(
        config: str = typer.Option(..., "--config", "-c", help="Broker TOML file."),
        flush: str = typer.Option(None, help="Override 'flush': sync or async."),
        replicate: str = typer.Option(None, help="Override 'replicate': sync or async."),
        log_level: str = typer.Option(None, help="Override 'log_level' (Python logging level)."),
    ) -> None:
        """Run one broker node of a Raft-replicated broker group."""
        import logging
        import os
        import sys

        from rich.console import Console
        from rich.markup import escape

        from commitlog import CorruptionError, DurableDataLostError, StorageError
        from ledgermq.base import loop
        from ledgermq.base.heap import settle_heap
        from ledgermq.broker.config import BrokerConfigError, load_config
        from ledgermq.broker.main import serve

        console = Console(highlight=False, stderr=True)

        def say(text: object, style: str = "red") -> None:
            # One line (soft_wrap: scripts and supervisors grep it), the text
            # escaped: "[raft]" or "[peers]" in a message is not markup.
            console.print(f"[{style}]broker: {escape(str(text))}[/{style}]", soft_wrap=True)

        try:
            cfg = load_config(config).with_overrides(
                flush=flush, replicate=replicate, log_level=log_level)
        except BrokerConfigError as exc:
            say(exc)
            raise typer.Exit(2) from None
        logging.basicConfig(level=cfg.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")

        def ready(host: str, port: int) -> None:
            # A process-wide setting, so here rather than in `serve`: the
            # startup heap leaves the cyclic collector's reach
            # (ledgermq/base/heap.py: full collections then pause the loop
            # for a few ms instead of 35-100 ms), and full collections come
            # ten times less often.
            settle_heap()
            print(f"broker listening on {host}:{port}", flush=True)

        try:
            restart = loop.run(serve(cfg, on_ready=ready))
        except BrokerConfigError as exc:  # refused at start: secret files, running open
            say(exc)
            raise typer.Exit(2) from None
        except (CorruptionError, DurableDataLostError) as exc:
            # Damaged at or before its durable point: only a repair brings it back.
            say(f"{exc}: refusing to start. Set the directory aside and rejoin the group"
                f" with `ledgermq node repair --data-dir {cfg.data_dir}`"
                " (docs/operations.md, \"Replica repair\")")
            raise typer.Exit(1) from None
        except (OSError, StorageError) as exc:  # a data directory it cannot start from
            say(exc)
            raise typer.Exit(1) from None
        if restart:
            # A rollback (broker/rollback.py) is carried out at start-up: run
            # this very command again in this process (same PID, so whoever
            # supervises it sees one process that never went away).
            say("restarting to roll back onto the group's log", "yellow")
            sys.stdout.flush()
            sys.stderr.flush()
            os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
