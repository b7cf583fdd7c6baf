"""Membership changes through the nodes' admin apps, made as an operator makes them.

Every operation is one POST /api/v1/members/{add,promote,remove,replace,rejoin}
to the group's leader, which strings it into single-server CONFIG entries and
answers with its `steps` ({action, node_id, index, seconds}) and the
configuration after them. The harness finds the leader by asking members'
admin apps (GET /api/v1/members: every node names its `leader_id`; only the
leader adds each member's replication state) and asks again after an answer
that says leadership is elsewhere (NOT_LEADER, LEADERSHIP_MOVED: a leader
asked to remove itself hands over first, and the operation is retried on the
new leader, exactly what `ledgermq member` does), after an unreachable
leader, and after a refusal or a timeout, until the operation's deadline. A
retry first reads the configuration: an operation whose effect is already
there (its earlier attempt committed, then the answer was lost) is done,
never applied twice. Only a 400 (the request itself is wrong) stops early.

Each attempt keeps its wall-clock start and end (`time.time_ns`, the
history's clock), so the availability gap of every CONFIG entry can be read
against the client history afterwards (chaos.membership_report).

The calls run in a thread of their own that first enters the backend's client
context (the netns backend's namespace), with an event loop of their own, so
nemesis threads can call them directly.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from chaos.backend import Backend
from ledgermq.client.admin import AdminApi, AdminApiError

T = TypeVar("T")
View = dict[str, Any]
# Answers after which the same operation may succeed on another try.
RETRY_CODES = ("NOT_LEADER", "LEADERSHIP_MOVED", "SERVICE_UNAVAILABLE", "UNREACHABLE",
               "MEMBERSHIP_REFUSED", "OUTCOME_UNKNOWN", "TRANSFER_FAILED", "HTTP_ERROR",
               "BAD_ANSWER")
ASK_TIMEOUT = 3.0  # one GET of a member's view
RETRY_PAUSE = 0.5
# Attempts kept in a record: the first and the last few (a minute of "no
# leader" retries would otherwise fill the history), with the total count.
KEPT_ATTEMPTS = 3


@dataclass
class Attempt:
    """One POST of an operation: when, and what came back."""

    started_ns: int
    finished_ns: int
    node: int | None  # whose admin app was asked (None: no leader found)
    error: str | None = None
    code: str | None = None
    status: int | None = None  # the HTTP status of an error answer (0: no answer)

    def to_json(self) -> dict[str, Any]:
        return {"started_ns": self.started_ns, "finished_ns": self.finished_ns,
                "node": self.node, "error": self.error, "code": self.code,
                "status": self.status}


@dataclass
class Change:
    """The outcome of one operator operation (possibly several attempts)."""

    action: str
    body: dict[str, Any]
    ok: bool = False
    # The CONFIG entries the successful attempt committed, each with the
    # wall-clock window it took: anchored at that attempt's start and laid end
    # to end by their `seconds` (the broker times each, not when each began).
    steps: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    error: str | None = None
    code: str | None = None
    already_done: bool = False  # found done on a retry (an earlier attempt committed)
    view: View | None = None  # the leader's configuration after the operation

    @property
    def started_ns(self) -> int:
        return self.attempts[0].started_ns if self.attempts else 0

    @property
    def finished_ns(self) -> int:
        return self.attempts[-1].finished_ns if self.attempts else 0

    def to_json(self) -> dict[str, Any]:
        kept = self.attempts
        if len(kept) > 2 * KEPT_ATTEMPTS:
            kept = kept[:KEPT_ATTEMPTS] + kept[-KEPT_ATTEMPTS:]
        return {"action": self.action, "body": self.body, "ok": self.ok, "steps": self.steps,
                "attempt_count": len(self.attempts),
                "attempts": [a.to_json() for a in kept], "error": self.error,
                "code": self.code, "already_done": self.already_done,
                "started_ns": self.started_ns, "finished_ns": self.finished_ns,
                "configuration": configuration(self.view)}


def configuration(view: View | None) -> dict[str, Any] | None:
    """The part of a members view the report keeps: who votes, who learns, where."""
    if view is None:
        return None
    return {"voters": sorted(view.get("voters", [])), "learners": sorted(view.get("learners", [])),
            "index": view.get("membership_index"), "pending": view.get("membership_pending"),
            "leader": view.get("leader_id"),
            "directories": {str(m["node_id"]): m.get("directory_id")
                            for m in view.get("members", [])}}


def member_row(view: View, node: int) -> dict[str, Any] | None:
    """`node`'s row in a members view (None: not a member)."""
    for row in view.get("members", []):
        if int(row.get("node_id", -1)) == node:
            return dict(row)
    return None


def anchored_steps(steps: list[dict[str, Any]], started_ns: int) -> list[dict[str, Any]]:
    """The broker's steps with wall-clock windows, laid end to end from `started_ns`."""
    out = []
    at = started_ns
    for step in steps:
        seconds = float(step.get("seconds", 0.0))
        end = at + int(seconds * 1e9)
        out.append({**step, "started_ns": at, "finished_ns": end})
        at = end
    return out


class MemberApi:
    """The group's membership, read and changed through the admin apps of `backend`'s nodes."""

    def __init__(self, backend: Backend, log: Callable[[str], None] = print) -> None:
        self.backend = backend
        self.log = log
        self._leader_hint: int | None = None

    # ------------------------------------------------------------ plumbing

    def _run(self, factory: Callable[[], Coroutine[Any, Any, T]], timeout: float) -> T:
        """Run a coroutine on a loop of its own, in a thread inside the client context."""
        box: list[tuple[bool, Any]] = []

        def target() -> None:
            try:
                self.backend.client_thread_init()()
                box.append((True, asyncio.run(factory())))
            except BaseException as exc:  # handed to the caller
                box.append((False, exc))

        thread = threading.Thread(target=target, name="chaos-members", daemon=True)
        thread.start()
        thread.join(timeout + 10.0)
        if not box:
            raise TimeoutError(f"admin call did not finish within {timeout + 10.0:g}s")
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def _client(self, node: int, timeout: float) -> AdminApi:
        security = self.backend.security
        credentials = self.backend.client_security.admin if security is not None else None
        return AdminApi(self.backend.admin_url(node), credentials=credentials,
                        ca_file=str(security.ca_file) if security is not None else "",
                        timeout=timeout)

    def _call(self, node: int, method: str, path: str, body: Any = None,
              timeout: float = ASK_TIMEOUT, query: dict[str, str | int] | None = None) -> Any:
        async def once() -> Any:
            async with self._client(node, timeout) as api:
                return await api.call(method, path, body, query)

        return self._run(once, timeout)

    def _candidates(self) -> list[int]:
        """Whom to ask for the leader: the last leader, members, then any live node."""
        order = [self._leader_hint] if self._leader_hint is not None else []
        order += self.backend.node_ids
        order += [n for n in self.backend.all_node_ids if self.backend.node_alive(n)]
        return [n for n in dict.fromkeys(order) if n is not None
                and self.backend.node_alive(n)]

    # ------------------------------------------------------------ reads

    def node_view(self, node: int) -> View | None:
        """GET /members of one node (None: it did not answer)."""
        try:
            answer = self._call(node, "GET", "members")
        except (AdminApiError, OSError, TimeoutError):
            return None
        return answer if isinstance(answer, dict) else None

    def leader_view(self) -> View | None:
        """The leader's view (with replication state), None when no leader answers."""
        asked: set[int] = set()
        queue = self._candidates()
        while queue:
            node = queue.pop(0)
            if node in asked:
                continue
            asked.add(node)
            view = self.node_view(node)
            if view is None:
                continue
            leader = view.get("leader_id")
            if leader is not None and int(leader) == int(view.get("node_id", -1)):
                self._leader_hint = node
                return view
            if leader and int(leader) not in asked and int(leader) in self.backend.all_node_ids:
                queue.insert(0, int(leader))
        return None

    def wait_view(self, until: Callable[[View], bool], timeout: float,
                  poll_s: float = 0.3) -> tuple[View | None, bool]:
        """Poll the leader's view until `until(view)` or `timeout`; (last view, whether met)."""
        deadline = time.monotonic() + timeout
        view: View | None = None
        while True:
            current = self.leader_view()
            if current is not None:
                view = current
                if until(view):
                    return view, True
            if time.monotonic() >= deadline:
                return view, False
            time.sleep(poll_s)

    # ------------------------------------------------------------ changes

    def change(self, action: str, body: dict[str, Any], *, timeout: float = 60.0,
               done: Callable[[View], bool] | None = None) -> Change:
        """POST members/`action` to the leader until it succeeds, is found done,
        is refused as a bad request (400), or `timeout` passes."""
        result = Change(action, dict(body))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if result.attempts and done is not None:
                view = self.leader_view()
                if view is not None and done(view):
                    result.ok, result.already_done, result.view = True, True, view
                    return result
            if result.attempts and left <= 0:
                return result
            started = time.time_ns()
            view = self.leader_view()
            leader = None if view is None else int(view["node_id"])
            attempt = Attempt(started, started, leader)
            result.attempts.append(attempt)
            if leader is None:
                attempt.error, attempt.code = "no leader answered", "NO_LEADER"
            else:
                # The broker's own deadline for each step, within ours.
                step_timeout = max(1.0, min(left, 60.0))
                try:
                    answer = self._call(leader, "POST", f"members/{action}",
                                        {**body, "timeout": step_timeout},
                                        timeout=step_timeout * 3 + 10)
                except AdminApiError as exc:
                    attempt.error, attempt.code, attempt.status = str(exc), exc.code, exc.status
                except (OSError, TimeoutError) as exc:
                    attempt.error, attempt.code = repr(exc), "UNREACHABLE"
                else:
                    attempt.finished_ns = time.time_ns()
                    result.ok = True
                    result.steps = anchored_steps(answer.get("steps", []), attempt.started_ns)
                    result.view = answer
                    return result
            attempt.finished_ns = time.time_ns()
            if attempt.code != result.code:  # say it once per kind of answer, not per retry
                self.log(f"chaos: member {action} {body}: {attempt.error} (retrying)")
            result.error, result.code = attempt.error, attempt.code
            if attempt.status == 400 or (attempt.code not in RETRY_CODES
                                         and attempt.code != "NO_LEADER"):
                return result  # the request itself is wrong: another try changes nothing
            if attempt.code in ("NOT_LEADER", "LEADERSHIP_MOVED", "UNREACHABLE",
                                "OUTCOME_UNKNOWN"):
                self._leader_hint = None
            if time.monotonic() >= deadline:
                return result
            time.sleep(RETRY_PAUSE)
