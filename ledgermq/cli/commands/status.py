"""`ledgermq status`: one table per broker group (node, role, term, indexes,
lag), from the admin API's cluster view (the NameServer's by default)."""

from __future__ import annotations

from typing import Any

import typer

from ledgermq.cli.admin_api import (
    ACCESS_KEY_OPTION,
    ADMIN_OPTION,
    NAMESRV_OPTION,
    SECRET_FILE_OPTION,
    TLS_CA_OPTION,
    call,
    target,
)
from ledgermq.cli.output import OUTPUT_OPTION, Output

# Short headers: nine columns must fit 80 terminal columns without eliding
# the node, its address or its role.
COLUMNS = ("node", "address", "role", "term", "last", "commit", "applied", "lag", "behind")


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(admin: str = ADMIN_OPTION, namesrv: str = NAMESRV_OPTION,
               output: Output = OUTPUT_OPTION, access_key: str = ACCESS_KEY_OPTION,
               secret_file: str = SECRET_FILE_OPTION,
               tls_ca_file: str = TLS_CA_OPTION) -> None:
        """Show every broker group's nodes: role, term, indexes (last, commit,
        applied), lag, and how far each follower is behind the leader."""
        from ledgermq.base import loop
        from ledgermq.cli.errors import fail
        from ledgermq.cli.wire_security import client_security

        view = (loop.run(wire_view(namesrv, client_security(access_key, secret_file,
                                                            tls_ca_file)))
                if namesrv else
                call(target(admin, access_key, secret_file, tls_ca_file=tls_ca_file), "GET",
                     "cluster"))
        groups = view.get("groups", {})
        if output is Output.json:
            from ledgermq.cli.output import print_json

            print_json(view)
        else:
            print_tables(groups)
        if not groups:
            raise fail("no broker registered")


def print_tables(groups: dict[str, Any]) -> None:
    from ledgermq.cli.output import console, table

    out = console()
    for name, group in sorted(groups.items()):
        t = table(f"group {name}: leader {group.get('leader') or 'none'},"
                  f" term {group.get('term')}", COLUMNS, keep=("node", "address", "role"))
        leader = next((n for n in group["nodes"] if n["node_id"] == group.get("leader")), None)
        followers = (leader or {}).get("followers") or {}
        for node in group["nodes"]:
            if not node["reachable"]:
                t.add_row(node["node_id"], node["address"], "[red]unreachable[/red]",
                          *[""] * (len(COLUMNS) - 3))
                continue
            role = node["role"] + ("" if node["role"] != "leader"
                                   or node.get("leader_ready") else " (not ready)")
            f = followers.get(node["node_id"].lstrip("n"))
            t.add_row(node["node_id"], node["address"], role, str(node["term"]),
                      str(node["last_index"]), str(node["commit_index"]),
                      str(node["applied_index"]), str(node["lag"]), str(f["lag"]) if f else "")
        out.print(t)
    if groups:
        out.print("lag = commit - applied; behind = entries not yet replicated here")


async def wire_view(namesrv: str, security: dict[str, Any]) -> dict[str, Any]:
    """The admin API's cluster view, built over the wire protocol instead
    (`security`: ledgermq.cli.wire_security.client_security's)."""
    from ledgermq.client.admin import Admin
    from ledgermq.webadmin.app import group_view, node_row

    async with Admin(namesrv.split(","), **security) as admin:
        groups = await admin.status()
    return {"groups": {name: group_view([node_row(r["node_id"], r["address"], r["status"],
                                                  r.get("registered_role")) for r in rows])
                       for name, rows in groups.items()}}
