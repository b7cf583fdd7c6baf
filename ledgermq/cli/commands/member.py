"""`ledgermq member list|add|promote|remove|replace|rejoin`: a broker group's
membership, read and changed through the admin API (the NameServer's forwards
to the group's leader; docs/operations.md, "Membership changes")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import typer

from ledgermq.cli.admin_api import (
    ACCESS_KEY_OPTION,
    ADMIN_OPTION,
    SECRET_FILE_OPTION,
    TLS_CA_OPTION,
    TOKEN_OPTION,
    Target,
    call,
    target,
)
from ledgermq.cli.commands.leader import node_number

member_app = typer.Typer(help="Membership of a broker group (voters and learners).",
                         no_args_is_help=True)

GROUP_OPTION = typer.Option("", help="Broker group (default: the only one registered).")
TIMEOUT_OPTION = typer.Option(60.0, help="Seconds each step may take (catch-up included).")
# A leader asked to remove itself hands leadership over and asks for a retry
# on the new one: a few attempts cover the election and the route update
# (and retries go on for as long as the command's --timeout allows).
LEADERSHIP_MOVED_RETRIES = 10
# Operations a retry finishes instead of repeating (ledgermq/broker/reconfigure.py).
RESUMABLE = ("add", "replace", "rejoin")
# What the leader's committed configuration shows once an operation is done
# (a members view -> bool), for `remove` and `promote`, which the broker
# refuses once done (a removed node is not a member, a voter is no learner):
# after OUTCOME_UNKNOWN the CLI looks before it retries.
Done = Callable[[dict[str, Any]], bool]


def _no_member(node_id: int) -> Done:
    return lambda view: all(m["node_id"] != node_id for m in view.get("members", []))


def _a_voter(node_id: int) -> Done:
    return lambda view: any(m["node_id"] == node_id and m["role"] == "voter"
                            for m in view.get("members", []))


def _committed_view(api: Target, group: str) -> dict[str, Any] | None:
    """The group's members view if it comes from its leader and names no
    change still committing (a follower's view, or a leader's pending entry,
    may still be cut), else None."""
    from ledgermq.webadmin.app import AdminApiError

    try:
        answer = call(api, "GET", "members", query={"group": group})
    except AdminApiError:
        return None  # no leader to ask yet: retry the operation
    view: dict[str, Any] = answer.get("groups", {}).get(group, answer)
    if view.get("leader_id") != view.get("node_id") or view.get("membership_pending"):
        return None
    return view


def _group(api: Target, group: str) -> str:
    from ledgermq.cli.errors import fail

    if group:
        return group
    groups = sorted(call(api, "GET", "cluster").get("groups", {}))
    if len(groups) != 1:
        raise fail(f"say which group with --group (registered: {', '.join(groups)})"
                   if groups else "no broker group is registered")
    return groups[0]


def _change(api: Target, group: str, action: str, body: dict[str, Any],
            timeout: float, done: Done | None = None) -> dict[str, Any]:
    """POST the change, retrying an answer that says to try again (another
    leader, none yet, or an outcome a leader change left unknown, for the
    operations that finish what an earlier attempt did or that say by `done`
    how to see that it did) until `timeout` seconds have passed, and at least
    LEADERSHIP_MOVED_RETRIES times."""
    from ledgermq.webadmin.app import AdminApiError

    body = {**body, "group": group, "timeout": timeout}
    deadline = time.monotonic() + timeout
    said = ""
    attempt = 0
    unknown = False
    while True:
        attempt += 1
        if unknown and done is not None:
            view = _committed_view(api, group)
            if view is not None and done(view):
                typer.echo(f"  the earlier {action} committed: nothing left to do")
                return {**view, "steps": []}
        try:
            answer: dict[str, Any] = call(api, "POST", f"members/{action}", body,
                                          timeout=timeout * 3 + 10)
            return answer
        except AdminApiError as exc:
            # OUTCOME_UNKNOWN (leadership changed under a CONFIG entry) is
            # retried only where a retry cannot do the change twice; after it,
            # an operation with `done` retries whatever the answer (a removed
            # node is "not a member") until its look above says it is done.
            unknown |= exc.code == "OUTCOME_UNKNOWN"
            retry = exc.code in ("LEADERSHIP_MOVED", "NOT_LEADER", "SERVICE_UNAVAILABLE") or (
                exc.code == "OUTCOME_UNKNOWN" and action in RESUMABLE) or (
                unknown and done is not None)
            if not retry or (attempt >= LEADERSHIP_MOVED_RETRIES
                             and time.monotonic() >= deadline):
                raise
            if exc.code in ("LEADERSHIP_MOVED", "OUTCOME_UNKNOWN") and str(exc) != said:
                said = str(exc)
                typer.echo(f"  {exc}")
            time.sleep(0.5)


def _print_view(view: dict[str, Any]) -> None:
    pending = " (not committed yet)" if view.get("membership_pending") else ""
    typer.echo(f"group {view.get('group')}: configuration at index "
               f"{view.get('membership_index')}{pending}, leader n{view.get('leader_id')}, "
               f"tolerates {view.get('fault_tolerance')} failed voter(s)")
    for m in view.get("members", []):
        extra = ""
        if "match" in m:
            extra = f"  match {m['match']} lag {m['lag']} {m['state']}"
            if m.get("identity_mismatch"):
                extra += (f"  IDENTITY MISMATCH: heard directory {m['heard_directory_id']}"
                          " (wiped? run `ledgermq member rejoin`)")
        lead = " leader" if m.get("leader") else ""
        typer.echo(f"  n{m['node_id']:<3} {m['role']:<8}{lead:<7} {m['address']:<22} "
                   f"dir {m['directory_id']}{extra}")


def _print_steps(answer: dict[str, Any]) -> None:
    for step in answer.get("steps", []):
        typer.echo(f"  {step['action']} n{step['node_id']}: committed at index "
                   f"{step['index']} in {step['seconds']:.3f}s")
    _print_view(answer)


@member_app.command("list")
def list_members(
    group: str = GROUP_OPTION, admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
    as_json: bool = typer.Option(False, "--json", help="The raw JSON answer."),
) -> None:
    """Voters and learners of each group, with the leader's view of their replication."""
    import json

    api = target(admin, access_key, secret_file, token, tls_ca_file)
    answer = call(api, "GET", "members", query={"group": group} if group else None)
    if as_json:
        typer.echo(json.dumps(answer, indent=2, sort_keys=True))
        return
    views = answer.get("groups", {"": answer})
    for name in sorted(views):
        _print_view(views[name])


@member_app.command("add")
def add(
    node: str = typer.Option(..., help="The new node: n4 or 4."),
    address: str = typer.Option(..., help="Its Raft HOST:PORT."),
    client_address: str = typer.Option("", help="Where its clients connect (HOST:PORT)."),
    directory_id: int = typer.Option(0, help="Its data-directory id (0: as heard)."),
    learner: bool = typer.Option(False, "--learner", help="Stay a learner (no promotion)."),
    group: str = GROUP_OPTION, timeout: float = TIMEOUT_OPTION,
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
) -> None:
    """Add a node as a learner and promote it to voter once it has caught up."""
    api = target(admin, access_key, secret_file, token, tls_ca_file)
    body = {"node_id": node_number(node), "address": address, "directory_id": directory_id,
            "client_address": client_address, "learner": learner}
    _print_steps(_change(api, _group(api, group), "add", body, timeout))


@member_app.command("promote")
def promote(
    node: str = typer.Option(..., help="The learner: n4 or 4."),
    group: str = GROUP_OPTION, timeout: float = TIMEOUT_OPTION,
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
) -> None:
    """Make a caught-up learner a voter."""
    api = target(admin, access_key, secret_file, token, tls_ca_file)
    node_id = node_number(node)
    _print_steps(_change(api, _group(api, group), "promote", {"node_id": node_id},
                         timeout, done=_a_voter(node_id)))


@member_app.command("remove")
def remove(
    node: str = typer.Option(..., help="The node to remove: n2 or 2."),
    force: bool = typer.Option(False, "--force",
                               help="Even if the voters left are not a healthy majority."),
    group: str = GROUP_OPTION, timeout: float = TIMEOUT_OPTION,
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
) -> None:
    """Remove a node (the leader hands leadership over first)."""
    api = target(admin, access_key, secret_file, token, tls_ca_file)
    node_id = node_number(node)
    _print_steps(_change(api, _group(api, group), "remove", {"node_id": node_id, "force": force},
                         timeout, done=_no_member(node_id)))


@member_app.command("replace")
def replace(
    old: str = typer.Option(..., help="The node that goes: n1 or 1."),
    new: str = typer.Option(..., help="The node that takes its place: n4 or 4."),
    address: str = typer.Option(..., help="The new node's Raft HOST:PORT."),
    client_address: str = typer.Option("", help="Where its clients connect (HOST:PORT)."),
    directory_id: int = typer.Option(0, help="Its data-directory id (0: as heard)."),
    group: str = GROUP_OPTION, timeout: float = TIMEOUT_OPTION,
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
) -> None:
    """Add the new node, promote it, remove the old one."""
    api = target(admin, access_key, secret_file, token, tls_ca_file)
    body = {"node_id": node_number(old), "new_node_id": node_number(new), "address": address,
            "client_address": client_address, "directory_id": directory_id}
    _print_steps(_change(api, _group(api, group), "replace", body, timeout))


@member_app.command("rejoin")
def rejoin(
    node: str = typer.Option(..., help="The node whose data directory is new: n3 or 3."),
    directory_id: int = typer.Option(0, help="Its new directory id (0: as heard)."),
    learner: bool = typer.Option(False, "--learner", help="Stay a learner (no promotion)."),
    group: str = GROUP_OPTION, timeout: float = TIMEOUT_OPTION,
    admin: str = ADMIN_OPTION, token: str = TOKEN_OPTION,
    access_key: str = ACCESS_KEY_OPTION, secret_file: str = SECRET_FILE_OPTION,
    tls_ca_file: str = TLS_CA_OPTION,
) -> None:
    """Re-admit a wiped or repaired node: learner under its new directory, then voter."""
    api = target(admin, access_key, secret_file, token, tls_ca_file)
    body = {"node_id": node_number(node), "directory_id": directory_id, "learner": learner}
    _print_steps(_change(api, _group(api, group), "rejoin", body, timeout))


def register(app: typer.Typer) -> None:
    app.add_typer(member_app, name="member")
