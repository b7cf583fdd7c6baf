"""`ledgermq cluster roll --dir DIR`: rolling restart of the local cluster that
`ledgermq dev --dir DIR` (or any `LocalCluster`) started.

Reads `DIR/cluster.json` (the PIDs and commands of the cluster's processes,
its addresses and security files), then restarts the broker nodes one at a
time as ledgermq/cli/rolling.py describes: followers first, the leader last
after handing its leadership over through the admin API; each node stopped
by its PID, started again with the same command (detached: it outlives this
command, and `ledgermq dev` stops it on Ctrl-C), and caught up before the
next. Prints each step and its availability gap; exit 1 when a step fails
(the nodes not reached yet are left as they were). For an upgrade, install
the new release first: each restarted node runs it (docs/operations.md).
"""

from __future__ import annotations

import typer

from ledgermq.cli.output import OUTPUT_OPTION, Output

cluster_app = typer.Typer(help="The local cluster `ledgermq dev` runs: rolling restart.",
                          no_args_is_help=True)


@cluster_app.command("roll")
def roll(
    directory: str = typer.Option("ledgermq-dev", "--dir",
                                  help="The cluster's directory (`ledgermq dev --dir`)."),
    nodes: str = typer.Option("", help="Node ids in the order to restart them, comma "
                              "separated (default: every node, followers first, the leader "
                              "last)."),
    catch_up_timeout: float = typer.Option(120.0, min=1.0, help="Seconds a restarted node "
                                           "may take to catch up before the roll stops."),
    start_timeout: float = typer.Option(60.0, min=1.0, help="Seconds a node may take to "
                                        "start again."),
    settle_timeout: float = typer.Option(30.0, min=1.0, help="Seconds to wait for the "
                                         "group to be whole before each node, and for a "
                                         "leader after each transfer and restart."),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Restart every broker node of a local cluster one at a time, without
    losing availability for more than a leadership transfer."""
    import time
    from pathlib import Path

    from ledgermq.cli.errors import fail
    from ledgermq.cli.output import print_json
    from ledgermq.cli.rolling import (
        GroupWatch,
        RollError,
        RollStep,
        admin_transfer,
        manifest_targets,
        ready_leader,
    )
    from ledgermq.cli.rolling import roll as roll_nodes

    base = Path(directory).expanduser().resolve()
    manifest = _manifest(base)
    addresses = {int(k): str(v["client"]) for k, v in manifest["nodes"].items()}
    settings = manifest.get("settings", {})
    credentials, admin_credentials, tls = _security(settings)
    steps: list[RollStep] = []

    def report(step: RollStep) -> None:
        steps.append(step)
        if output is Output.table:
            typer.echo(step.describe())
            for note in step.notes:
                typer.echo(f"  note: {note}")

    with GroupWatch(addresses, credentials=credentials, tls=tls) as watch:
        try:
            leader = watch.wait_for("a ready leader", ready_leader, settle_timeout)
        except RollError as exc:
            raise fail(f"{base}: waited for {exc}; is the cluster running?") from None
        order = _order(nodes, leader, addresses)
        if output is Output.table:
            typer.echo(f"Rolling restart of group {manifest.get('group', '?')} under {base}:"
                       f" nodes {', '.join(f'n{n}' for n in order)} (n{leader} leads)")
        started = time.monotonic()
        try:
            roll_nodes(manifest_targets(base, order), watch,
                       admin_transfer(admin_credentials, str(settings.get("admin_token", "")),
                                      str(settings.get("tls_ca_file", ""))),
                       start_timeout=start_timeout, catch_up_timeout=catch_up_timeout,
                       settle_timeout=settle_timeout, report=report)
        except RollError as exc:
            if output is Output.json:
                print_json({"steps": [s.to_json() for s in steps], "error": str(exc)})
            raise fail(str(exc)) from None
    total = time.monotonic() - started
    if output is Output.json:
        print_json({"steps": [s.to_json() for s in steps], "seconds": round(total, 3)})
        return
    worst = max((s.longest_gap_s for s in steps), default=0.0)
    typer.echo(f"Done: {len(steps)} nodes restarted in {total:.1f} s; longest availability"
               f" gap {worst:.2f} s")


def _manifest(base: object) -> dict:
    from ledgermq.broker.launcher import MANIFEST, read_manifest
    from ledgermq.cli.errors import fail

    try:
        return read_manifest(str(base))
    except FileNotFoundError:
        raise fail(f"{base}/{MANIFEST} not found: no local cluster was started there"
                   " (`ledgermq dev --dir DIR` writes it)") from None
    except ValueError as exc:
        raise fail(f"{base}/{MANIFEST} is not readable: {exc}") from None


def _order(nodes: str, leader: int, addresses: dict[int, str]) -> list[int]:
    from ledgermq.cli.commands.leader import node_number
    from ledgermq.cli.errors import fail
    from ledgermq.cli.rolling import roll_order

    if not nodes:
        return roll_order(leader, sorted(addresses))
    order = [node_number(part.strip()) for part in nodes.split(",") if part.strip()]
    unknown = [n for n in order if n not in addresses]
    if unknown or len(set(order)) != len(order):
        raise fail(f"--nodes {nodes!r}: each of {sorted(addresses)} at most once")
    return order


def _security(settings: dict) -> tuple:
    """(cluster credentials for the wire status, admin credentials for the
    transfer, TLS client context) from the manifest's security files."""
    from ledgermq.wire.auth import CLUSTER_KEY, Credentials, read_secret_file
    from ledgermq.wire.tls import client_context

    cluster = (Credentials(CLUSTER_KEY, read_secret_file(settings["cluster_secret_file"]))
               if settings.get("cluster_secret_file") else None)
    admin = (Credentials(settings.get("admin_access_key") or "admin",
                         read_secret_file(settings["admin_secret_file"]))
             if settings.get("admin_secret_file") else None)
    tls = (client_context(settings["tls_ca_file"])
           if settings.get("tls_ca_file") and settings.get("tls_cert_file") else None)
    return cluster, admin, tls


def register(app: typer.Typer) -> None:
    app.add_typer(cluster_app, name="cluster")
