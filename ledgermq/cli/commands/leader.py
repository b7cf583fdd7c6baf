"""`ledgermq leader transfer --to N`: hand a broker group's Raft leadership
to another node through the admin API (the NameServer's forwards it to the
group's leader, which waits until the new node leads)."""

from __future__ import annotations

import typer

from ledgermq.cli.admin_api import (
    ACCESS_KEY_OPTION,
    ADMIN_OPTION,
    SECRET_FILE_OPTION,
    TLS_CA_OPTION,
    TOKEN_OPTION,
    call,
    target,
)

leader_app = typer.Typer(help="Raft leadership of a broker group.", no_args_is_help=True)


def node_number(node: str) -> int:
    """`n2` or `2` -> 2."""
    digits = node[1:] if node[:1].lower() == "n" else node
    if not (digits.isascii() and digits.isdigit()):
        raise typer.BadParameter(f"{node!r} is not a node id (n2 or 2)")
    return int(digits)


@leader_app.command("transfer")
def transfer(
    to: str = typer.Option(..., help="Node to lead: n2 or 2."),
    group: str = typer.Option("", help="Broker group (default: the only one registered)."),
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
) -> None:
    """Make node `--to` the leader of its broker group (exit 1 if it does not
    take over within a few election timeouts)."""
    from ledgermq.cli.errors import fail

    node = node_number(to)
    api = target(admin, access_key, secret_file, token, tls_ca_file)
    if not group:
        groups = sorted(call(api, "GET", "cluster").get("groups", {}))
        if len(groups) != 1:
            raise fail(f"say which group with --group (registered: {', '.join(groups)})"
                       if groups else "no broker group is registered")
        group = groups[0]
    answer = call(api, "POST", "leadership/transfer", {"group": group, "to": node})
    typer.echo(f"group {answer.get('group', group)}: leader is now n{answer['leader_id']}")


def register(app: typer.Typer) -> None:
    app.add_typer(leader_app, name="leader")
