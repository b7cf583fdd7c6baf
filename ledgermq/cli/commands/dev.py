"""`ledgermq dev`: a NameServer and one broker group on loopback, until Ctrl-C.

Authentication is on by default: the first start generates a cluster secret
and the bootstrap administrator's secret under `<dir>/secrets/` (0600), later
starts on the same directory reuse them, and the command prints the two
variables a user exports for the CLI and the SDK. `--open` runs without
authentication, and then only on loopback addresses.

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
        open_: bool = typer.Option(
            False, "--open", "--insecure",
            help="No authentication (no secrets; loopback addresses only)."),
    ) -> None:
        """Run a local NameServer and an N-node broker group until Ctrl-C."""
        import asyncio
        import contextlib
        import shlex
        from pathlib import Path

        from rich.console import Console
        from rich.table import Table

        from ledgermq.base.address import is_loopback_host
        from ledgermq.base.stop_flag import StopFlag, stop_on_signals
        from ledgermq.broker.launcher import ADMIN_ACCESS_KEY, LocalCluster, wait_leader
        from ledgermq.cli.commands.namesrv import parse_listen
        from ledgermq.wire.auth import SecretFileError

        console = Console(highlight=False)
        if open_:
            exposed = [a for a in (namesrv, admin)
                       if a and not is_loopback_host(parse_listen(a)[0])]
            if exposed:
                typer.echo(f"error: --open runs on loopback addresses only, not on "
                           f"{', '.join(exposed)}: drop --open (authentication on)", err=True)
                raise typer.Exit(2)
        directory = str(Path(directory).expanduser().resolve())
        cluster = LocalCluster(directory, nodes=nodes, namesrv_listen=namesrv,
                               settings={"flush": flush, "replicate": replicate},
                               log_level="INFO", admin_listen=admin, secure=not open_)
        # Not a threading.Event: its set() in a signal handler can deadlock
        # (ledgermq/base/stop_flag.py).
        stop = StopFlag()
        held = contextlib.ExitStack()  # closed last: the flag, and the handlers restored
        held.enter_context(stop)
        held.enter_context(stop_on_signals(stop))
        try:
            try:
                cluster.start()
            except SecretFileError as exc:  # e.g. a secret file others may read
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(2) from None
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
            if open_:
                console.print("[yellow]Authentication is off (--open): anyone on this "
                              "machine can read, write and delete data.[/yellow]")
            else:
                cluster_file, admin_file = cluster.secret_paths
                made = "generated now" if cluster.generated else "reused"
                console.print(f"Authentication is on. Secrets (mode 0600, {made}) in "
                              f"{cluster_file.parent}/:\n"
                              f"  {cluster_file.name}  the cluster secret (brokers and "
                              f"NameServer)\n"
                              f"  {admin_file.name}    the administrator "
                              f"{ADMIN_ACCESS_KEY!r} (keep it private)\n"
                              "To use the CLI and the SDK, in your shell:", soft_wrap=True)
                # Plain lines a user copies: no wrapping, no styling.
                print(f"export LEDGERMQ_ACCESS_KEY={ADMIN_ACCESS_KEY}", flush=True)
                print(f"export LEDGERMQ_SECRET_FILE={shlex.quote(str(admin_file))}", flush=True)
            console.print(f"Try: ledgermq send demo hello --namesrv {cluster.namesrv_address}"
                          "   (Ctrl-C stops everything)", soft_wrap=True)
            if admin:
                console.print(f"Dashboard and admin API: http://{admin}/  "
                              f"(ledgermq status --admin http://{admin})")
            while not stop.wait(0.5):
                alive = cluster.alive()  # restarted by `ledgermq cluster roll` included
                dead = [n for n in cluster.brokers if n not in alive]
                if cluster.namesrv is not None and not cluster.namesrv.alive:
                    console.print("[red]the NameServer exited[/red]")
                    break
                if dead:
                    console.print(f"[yellow]broker(s) {dead} exited[/yellow]", end="\r")
        finally:
            console.print("stopping children ...")
            cluster.stop()
            held.close()
            console.print("stopped")
