"""`ledgermq node identity|repair`: one node's data directory, on its machine.

`identity` shows what the directory's `IDENTITY` file says (cluster, node,
directory id, format version) and, given the node's broker config, whether a
broker started with it would accept the directory. `repair` sets a damaged
data directory aside whole, as the sibling `<dir>.damaged-<UTC time>`
(nothing is deleted), leaves an empty directory with a new identity in its
place and prints what the operator does next: start the node, rejoin it to
its group, check. Both work on the files only, with the broker stopped
(`repair` refuses while a broker holds the directory's lock). See
docs/operations.md, "Data directory identity" and "Replica repair".
"""

from __future__ import annotations

import time
from typing import Any

import typer

from ledgermq.cli.output import OUTPUT_OPTION, Output

node_app = typer.Typer(help="One node's data directory: identity, repair.",
                       no_args_is_help=True)

DATA_DIR_OPTION = typer.Option("", "--data-dir", "-d",
                               help="The node's data directory (default: its config's).")
CONFIG_OPTION = typer.Option("", "--config", "-c",
                             help="The node's broker config (TOML): its data directory, "
                             "node id and cluster id.")


def _config(path: str) -> Any:
    """The broker config at `path`, or None when no path is given."""
    if not path:
        return None
    from ledgermq.broker.config import BrokerConfigError, load_config
    from ledgermq.cli.errors import fail

    try:
        return load_config(path)
    except BrokerConfigError as exc:
        raise fail(str(exc)) from None


def _data_dir(data_dir: str, config: Any) -> str:
    from ledgermq.cli.errors import fail

    if data_dir:
        return data_dir
    if config is None:
        raise fail("say which data directory: --data-dir DIR or --config FILE")
    return str(config.data_dir)


def _utc(ms: int) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def _rows(identity: Any) -> list[tuple[str, str]]:
    from dledger.runtime.identity import FORMAT_VERSION, FORMAT_VERSION_MIN

    supported = (str(FORMAT_VERSION) if FORMAT_VERSION == FORMAT_VERSION_MIN
                 else f"{FORMAT_VERSION_MIN}..{FORMAT_VERSION}")
    return [("cluster id", identity.cluster_id), ("node id", str(identity.node_id)),
            ("directory id", f"{identity.directory_id} (0x{identity.directory_id:016x})"),
            ("format version", f"{identity.format_version} (this build reads {supported})"),
            ("created", _utc(identity.created_ms))]


def next_steps(node_id: int, aside: str | None) -> list[str]:
    """What the operator does after `node repair` (docs/operations.md, "Replica repair")."""
    steps = [
        f"Start node {node_id} again with its usual command. It starts empty under its new"
        " directory id and cannot vote: the group pinned the old one.",
        f"Rejoin it: `ledgermq member rejoin --node {node_id}` (add --group G if several"
        " groups are registered). The leader makes it a learner under the new directory id,"
        " catches it up by snapshot install and promotes it back to voter.",
        f"Check: `ledgermq member list` shows node {node_id} as a voter with no identity"
        " mismatch.",
    ]
    if aside:
        steps.append(f"Inspect {aside} at leisure and delete it yourself: nothing deletes it.")
    return steps


@node_app.command("identity")
def identity(data_dir: str = DATA_DIR_OPTION, config: str = CONFIG_OPTION,
             output: Output = OUTPUT_OPTION) -> None:
    """Show a data directory's identity; with --config, also check that the
    node would start on it (exit 1 when it would refuse)."""
    import os

    from rich.text import Text

    from dledger.runtime.identity import IdentityError, holds_data, read_identity
    from ledgermq.cli.errors import fail
    from ledgermq.cli.output import console, print_json, table

    cfg = _config(config)
    directory = _data_dir(data_dir, cfg)
    if not os.path.isdir(directory):
        raise fail(f"{directory} does not exist (a node creates it, with a new identity,"
                   " at its first start)")
    try:
        found = read_identity(directory)
    except IdentityError as exc:
        raise fail(str(exc)) from None
    if found is None:
        what = ("it holds data from before identities: the next start adopts it"
                if holds_data(directory) else "the next start creates one")
        raise fail(f"{directory} has no identity yet ({what})")
    problem = ""
    if cfg is not None:
        if found.cluster_id != cfg.identity_cluster_id:
            problem = (f"the config {config} is for cluster {cfg.identity_cluster_id!r}, the"
                       f" directory belongs to {found.cluster_id!r}: the broker would refuse it")
        elif found.node_id != cfg.node_id:
            problem = (f"the config {config} is node {cfg.node_id}, the directory belongs to"
                       f" node {found.node_id}: the broker would refuse it")
    if output is Output.json:
        print_json({"data_dir": os.path.abspath(directory), **found.to_json(),
                    **({"config": config, "matches_config": not problem} if cfg else {})})
    else:
        t = table(f"data directory {os.path.abspath(directory)}", ("field", "value"),
                  keep=("field",))
        for name, value in _rows(found):
            t.add_row(name, Text(value))  # Text: a "[" in a cluster id is not markup
        if cfg is not None:
            t.add_row("matches config", Text("no" if problem else f"yes ({config})"))
        console().print(t)
    if problem:
        raise fail(problem)


@node_app.command("repair")
def repair(
    data_dir: str = DATA_DIR_OPTION, config: str = CONFIG_OPTION,
    cluster_id: str = typer.Option("", help="Cluster id of the new identity (default: the "
                                   "config's, else the old identity's)."),
    node_id: int = typer.Option(0, min=0, help="Node id of the new identity (default: the "
                                "config's, else the old identity's)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would happen; change "
                                 "nothing."),
    output: Output = OUTPUT_OPTION,
) -> None:
    """Set a damaged data directory aside (never deleted) and leave an empty
    one with a new identity; then rejoin the node (the printed next steps).
    Run it with the node stopped."""
    import os

    from dledger.runtime.identity import IdentityError, read_identity
    from dledger.runtime.identity import repair as repair_directory
    from ledgermq.cli.errors import fail
    from ledgermq.cli.output import print_json

    cfg = _config(config)
    directory = os.path.abspath(_data_dir(data_dir, cfg))
    cluster = cluster_id or (cfg.identity_cluster_id if cfg is not None else None)
    node = node_id or (cfg.node_id if cfg is not None else None)
    if dry_run:
        try:
            old = read_identity(directory) if os.path.isdir(directory) else None
            problem = "" if old else "no identity"
        except IdentityError as exc:
            old, problem = None, str(exc)
        cluster = cluster or (old.cluster_id if old else None)
        node = node or (old.node_id if old else None)
        if not cluster or not node:
            raise fail(f"{directory}: the old identity cannot be read ({problem}): give"
                       " --config, or --cluster-id and --node-id")
        where = (f"into {directory}/damaged-<UTC time>/ (it is a mount point)"
                 if os.path.ismount(directory) else f"as {directory}.damaged-<UTC time>")
        typer.echo(f"would set {directory} aside {where} and create an empty one for node"
                   f" {node} of cluster {cluster!r} with a new directory id")
        return
    try:
        done = repair_directory(directory, cluster, node)
    except IdentityError as exc:
        raise fail(str(exc)) from None
    steps = next_steps(done.identity.node_id, done.aside)
    if output is Output.json:
        print_json({"data_dir": done.data_dir, "aside": done.aside,
                    "previous": done.previous.to_json() if done.previous else None,
                    "previous_problem": done.previous_problem,
                    "identity": done.identity.to_json(), "next_steps": steps})
        return
    if done.aside:
        typer.echo(f"Set aside: {done.data_dir} -> {done.aside} (kept whole for inspection;"
                   " nothing was deleted)")
    else:
        typer.echo(f"Nothing to set aside: {done.data_dir} was missing or empty")
    if done.previous is not None:
        typer.echo(f"Old identity: node {done.previous.node_id} of cluster"
                   f" {done.previous.cluster_id!r}, directory id {done.previous.directory_id}")
    elif done.previous_problem:
        typer.echo(f"Old identity: unreadable ({done.previous_problem})")
    typer.echo(f"New identity: node {done.identity.node_id} of cluster"
               f" {done.identity.cluster_id!r}, directory id {done.identity.directory_id}")
    typer.echo("Next steps:")
    for n, step in enumerate(steps, 1):
        typer.echo(f"  {n}. {step}")


def register(app: typer.Typer) -> None:
    app.add_typer(node_app, name="node")
