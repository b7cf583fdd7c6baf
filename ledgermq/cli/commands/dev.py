"""`ledgermq dev`: a NameServer and one broker group on loopback, until Ctrl-C.

The children run in their own process groups; this command stops each of
them by PID when it is interrupted, terminated, or fails to start them.
They also run in the repository root, so `--dir` is made absolute against
the caller's working directory first.
"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("dev")
    def dev(
        directory: str = typer.Option("ledgermq-dev", "--dir", help="Data and log directory."),
        nodes: int = typer.Option(3, min=1, max=9, help="Nodes in the broker group."),
        namesrv: str = typer.Option("127.0.0.1:9876", help="NameServer listen address."),
        flush: str = typer.Option(
            "sync", help="flush: sync (fsync before the ack, the default) or async."),
        replicate: str = typer.Option("sync", help="replicate: sync or async."),
        admin: str = typer.Option("127.0.0.1:9877", help="NameServer admin app (API, "
                                  "dashboard, metrics) address; empty: no admin apps."),
    ) -> None:
        """Run a local NameServer and an N-node broker group until Ctrl-C."""
        import asyncio
        import signal
        import threading
        from pathlib import Path

        from rich.console import Console
        from rich.table import Table

        from ledgermq.broker.launcher import LocalCluster, wait_leader

        console = Console(highlight=False)
        directory = str(Path(directory).expanduser().resolve())
        cluster = LocalCluster(directory, nodes=nodes, namesrv_listen=namesrv,
                               settings={"flush": flush, "replicate": replicate},
                               log_level="INFO", admin_listen=admin)
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        try:
            try:
                cluster.start()
            except RuntimeError as exc:  # a child did not start: its output says why
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from None
            assert cluster.namesrv is not None  # start() returned: it runs
            leader = asyncio.run(wait_leader(cluster))
            # The boxed table's │ separators are what scripts (and tests) parse.
            t = Table(title=f"LedgerMQ dev cluster (data and logs under {directory})")
            for column in ("process", "pid", "client address", "raft address"):
                t.add_column(column, no_wrap=True)
            t.add_row("namesrv", str(cluster.namesrv.proc.pid), cluster.namesrv_address, "")
            for nid, child in sorted(cluster.brokers.items()):
                role = " (leader)" if nid == leader else ""
                t.add_row(f"broker n{nid}{role}", str(child.proc.pid),
                          cluster.peers[nid].client, cluster.peers[nid].raft)
            console.print(t)
            console.print(f"Try: ledgermq send demo hello --namesrv {cluster.namesrv_address}"
                          "   (Ctrl-C stops everything)")
            if admin:
                console.print(f"Dashboard and admin API: http://{admin}/  "
                              f"(ledgermq status --admin http://{admin})")
            while not stop.wait(0.5):
                dead = [n for n, c in cluster.brokers.items() if not c.alive]
                if cluster.namesrv is not None and not cluster.namesrv.alive:
                    console.print("[red]the NameServer exited[/red]")
                    break
                if dead:
                    console.print(f"[yellow]broker(s) {dead} exited[/yellow]", end="\r")
        finally:
            console.print("stopping children ...")
            cluster.stop()
            console.print("stopped")
