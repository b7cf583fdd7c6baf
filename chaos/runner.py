"""One chaos run, start to finish.

1. Start the cluster on a backend (for netns: a private namespace) and wait
   for a ready leader; create the topic.
2. Start the consumers and producers; drive the nemeses on their schedule
   for `time_limit` seconds (longer while a membership plan is unfinished,
   up to three times as long: chaos.schedule).
3. Final heal: every active nemesis is stopped (links healed, nodes resumed
   and restarted), then wait for a leader again, and ask every node whether
   it is up (alive and answering PING).
4. Stop the producers, then the consumers; drain every queue from offset 0;
   then every node that is up must apply the leader's commit index
   (`chaos.convergence`: a replica left behind is a finding).
5. Stop the cluster; check the history; write results.json, plots and
   index.html next to history.jsonl, the node logs and data directories.

With `secure`, the cluster runs with authentication and TLS on every port
and the workload as an ACL user (chaos.security); everything else, the
nemeses and the verdicts included, is the same.

With `retention` (chaos.retention), every node runs with small segments, a
small `retention_bytes` and frequent snapshots, so retention deletes
segments while the faults run; every node's BROKER_STATUS is sampled once a
second (first index, snapshots, installs) and each data directory's
remaining segments are listed after the run: `results.json`'s `retention`
section. The checker then counts unread acknowledged messages the drain was
told were deleted as `expired`, never as valid reads, and every other one
as lost; a retention run in which no node deleted a segment is not valid
(it did not test what it was asked to).

With a membership nemesis (chaos.membership), the run knows spare nodes
(`spares`, by default as many as its nemeses need) and starts admin apps;
the nemeses add, remove, replace and repair nodes through them, and the
harness's view of the group (the nodes every other nemesis targets, the
nodes expected up, converged and routed at the end) follows the
configuration the leader reports. After the drain the run reads the final
configuration from the leader and through `ledgermq member list` on the
NameServer, and the topic's route; `results.json`'s `membership` section
lists every step with its availability gap (chaos.membership_report) and
why the membership part is not valid, if it is not.

A run is valid only when the checker finds nothing, the run finished, every
node that is up caught up, and every node came back (chaos.node_report;
`may_stay_down=1` on a nemesis is the explicit way to accept a node that
stays down). `invalid_because` in
results.json lists every reason it is not.

The clients run on an asyncio loop in a thread of their own that first
enters the backend's client context (the namespace), while the main thread
stays outside and owns teardown, so Ctrl-C or SIGTERM still stops every
process and deletes the namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos import catalog
from chaos import membership as membership_lib
from chaos import nemesis as nemesis_lib
from chaos.backend import Backend, ClusterSpec
from chaos.checker import check
from chaos.convergence import check_converged
from chaos.history import History
from chaos.members_api import MemberApi, configuration
from chaos.membership_report import final_problems, step_gaps, summary
from chaos.node_report import node_report
from chaos.report import write_report
from chaos.retention import (
    RetentionMonitor,
    RetentionSpec,
    disk_evidence,
    retention_problems,
    summarize,
)
from chaos.schedule import Schedule, run_schedule
from chaos.stats import latencies, latency_summary, unavailability
from chaos.workload import Workload, WorkloadSpec, find_leader, node_status, wait_leader
from ledgermq.base.address import split_host_port
from ledgermq.base.codes import RequestCode
from ledgermq.base.errors import LedgerMQError
from ledgermq.wire import RpcClient


@dataclass
class RunConfig:
    out: Path
    nodes: int = 3
    nemesis: str = "partition-halves"
    time_limit: float = 30.0
    rate: float = 50.0
    flush: str = "sync"
    replicate: str = "sync"
    backend: str = "netns"
    seed: int | None = None
    schedule: Schedule = field(default_factory=Schedule)
    producers: int = 4
    consumers: int = 2
    queues: int = 4
    recovery_timeout: float = 60.0
    drain_timeout: float = 90.0
    # How long each node gets to answer PING after the final heal.
    final_node_timeout: float = 15.0
    # How long the replicas get to apply the leader's commit after the drain.
    convergence_timeout: float = 30.0
    log_level: str = "INFO"
    # Extra top-level broker configuration keys for every node.
    broker_config: dict[str, Any] = field(default_factory=dict)
    # Authentication and TLS on every port, the workload as an ACL user
    # (chaos.security).
    secure: bool = False
    # Retention small enough to delete segments during the run (chaos.retention);
    # None: the brokers' defaults (72 h, no size limit: nothing is deleted).
    retention: RetentionSpec | None = None
    # Spare nodes for the membership nemeses (None: as many as they need).
    spares: int | None = None
    # The producers' client-side merging (False: every send is its own
    # SEND_MESSAGES request, the SDK's per-message path).
    coalesce: bool = True

    def __post_init__(self) -> None:
        """Numbers no run can have are refused before anything starts (a
        negative --time-limit used to run, and pass, a run of no faults)."""
        if self.nodes not in (3, 5):
            raise ValueError(f"nodes must be 3 or 5, not {self.nodes}")
        for name, value in (("time_limit", self.time_limit), ("rate", self.rate)):
            if not value > 0:  # NaN fails too
                raise ValueError(f"{name} must be more than 0, not {value:g}")
        for name, count, least in (("producers", self.producers, 1),
                                   ("consumers", self.consumers, 0),
                                   ("queues", self.queues, 1)):
            if count < least:
                raise ValueError(f"{name} must be at least {least}, not {count}")


@dataclass
class NodeState:
    """What the client side learns about the nodes, for `chaos.node_report`."""

    # Every restart a nemesis attempted (appended to by `nemesis.Context`).
    restarts: list[dict[str, Any]] = field(default_factory=list)
    # Each node's state after the final heal; None if the run did not get there.
    final: dict[int, dict[str, Any]] | None = None
    # Retention runs: what the status monitor saw of each node.
    retention: dict[str, dict[str, Any]] | None = None
    # Membership runs: the final configuration, route and operator's view.
    membership: dict[str, Any] | None = None


def make_backend(config: RunConfig, spec: ClusterSpec, log: Callable[[str], None],
                 seed: int) -> Backend:
    if config.backend == "netns":
        from chaos.netns import NetnsBackend

        return NetnsBackend(spec, config.out, log=log, seed=seed)
    if config.backend == "docker":
        from chaos.docker_backend import DockerBackend

        return DockerBackend(spec, config.out, log=log, seed=seed)
    raise ValueError(f"unknown backend {config.backend!r}")


def run(config: RunConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one chaos test; returns results (also written to `out`)."""
    seed = config.seed if config.seed is not None else random.randrange(1 << 31)
    rng = random.Random(seed)
    nemeses = catalog.parse(config.nemesis)
    wanted = nemesis_lib.needs(nemeses)
    changes_members = "membership" in wanted
    spares = config.spares if config.spares is not None else \
        membership_lib.spares_for(nemeses, config.nodes)
    extra = dict(config.broker_config)
    segment_size = ClusterSpec.segment_size_bytes
    if config.retention is not None:
        extra.update(config.retention.broker_config())
        segment_size = config.retention.segment_size_bytes
    spec = ClusterSpec(nodes=config.nodes, flush=config.flush, replicate=config.replicate,
                       proxied="delay" in wanted, faketime="clock" in wanted,
                       log_level=config.log_level, extra=extra, secure=config.secure,
                       segment_size_bytes=segment_size, spares=spares,
                       admin=changes_members)
    out = Path(config.out)
    if (out / "history.jsonl").exists() or (out / "data").exists():
        # An earlier run's data directories would be started as this run's
        # nodes (and its history appended to): refuse rather than mix runs.
        raise ValueError(f"{out} already holds a chaos run; choose a new --out")
    out.mkdir(parents=True, exist_ok=True)
    history = History(out / "history.jsonl")
    params = {**asdict(config), "out": str(out), "seed": seed,
              "retention": config.retention.to_json() if config.retention else None,
              "schedule": asdict(config.schedule), "nemeses": [n.name for n in nemeses],
              "spares": spares}
    log(f"chaos: run {json.dumps(params, default=str)}")
    backend = make_backend(config, spec, log, seed)
    outcome: dict[str, Any] = {}
    node_state = NodeState()  # filled by the client side
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        backend.start()
        for need in sorted(wanted):
            backend.require(need)  # refuse loudly before any fault, never a silent no-op
        _run_clients(config, backend, nemeses, history, rng, outcome, node_state, log)
    finally:
        with contextlib.suppress(Exception):
            backend.close()
        history.close()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
    collected = backend.collect()
    ops = history.ops
    results: dict[str, Any] = {
        "valid": None,
        "invalid_because": [],
        "run": params,
        "checker": check(ops, retention=config.retention is not None),
        "nodes": node_report(node_state.restarts, node_state.final),
        "availability": unavailability(ops),
        "latency": latency_summary(latencies(ops)),
        "phases": outcome,
        "capabilities": backend.capabilities(),
        "collected": collected,
    }
    if changes_members:
        results["membership"] = membership_results(ops, node_state.membership, nemeses, spec)
    if config.retention is not None:
        results["retention"] = summarize(
            config.retention, node_state.retention,
            disk_evidence({n: backend.data_dir(n) for n in backend.node_ids},
                          config.retention.segment_size_bytes))
    reasons = verdict_reasons(results)
    results["valid"] = not reasons
    results["invalid_because"] = reasons
    for reason in reasons:
        log(f"chaos: NOT VALID: {reason}")
    write_report(ops, results, out)
    return results


def verdict_reasons(results: dict[str, Any]) -> list[str]:
    """Why a run is not valid (empty: it is): the checker, an error, the nodes."""
    reasons = []
    if not results["checker"]["valid"]:
        reasons.append("checker: " + (", ".join(results["checker"].get("bad_kinds", []))
                                      or "invalid"))
    if results["phases"].get("error"):
        reasons.append(f"the run did not finish: {results['phases']['error']}")
    reasons += results["nodes"]["problems"]
    if results.get("retention") is not None:
        reasons += retention_problems(results["retention"])
    if results.get("membership") is not None:
        reasons += results["membership"]["problems"]
    convergence = results["phases"].get("convergence")
    if convergence is not None and not convergence["converged"]:
        reasons.append(f"nodes {convergence['behind']} did not catch up with the leader's "
                       f"commit index {convergence['target_commit']} after the drain")
    return reasons


def membership_results(ops: list[Any], final: dict[str, Any] | None,
                       nemeses: list[nemesis_lib.Nemesis], spec: ClusterSpec) -> dict[str, Any]:
    """The membership section of results.json: steps with their gaps, the
    final configuration against the intended one, and what is wrong."""
    steps = step_gaps(ops)
    original = spec.original_ids
    intended = membership_lib.intention(nemeses, original,
                                        [n for n in spec.all_ids if n not in original])
    final = final or {}
    problems = final_problems(steps, final.get("configuration"), final.get("believed", []),
                              intended, final.get("route_nodes"), final.get("cli"))
    if not final:
        problems.append("the final configuration was not read (the run did not get there)")
    return {"initial_voters": original, "spares": [n for n in spec.all_ids if n not in original],
            "intended": intended, "final": final.get("configuration"),
            "believed_members": final.get("believed"), "removed": final.get("removed"),
            "route_nodes": final.get("route_nodes"), "cli": final.get("cli"),
            "steps": steps, "summary": summary(steps), "problems": problems}


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _run_clients(config: RunConfig, backend: Backend, nemeses: list[nemesis_lib.Nemesis],
                 history: History, rng: random.Random, outcome: dict[str, Any],
                 node_state: NodeState, log: Callable[[str], None]) -> None:
    """Run the asyncio client side in its own thread; Ctrl-C cancels it cleanly."""
    loop_box: list[asyncio.AbstractEventLoop] = []
    task_box: list[asyncio.Task[None]] = []
    failure: list[BaseException] = []
    ready = threading.Event()

    def thread_main() -> None:
        try:
            backend.client_thread_init()()
            loop = asyncio.new_event_loop()
            loop_box.append(loop)
            task = loop.create_task(_clients(config, backend, nemeses, history, rng,
                                             outcome, node_state, log, loop))
            task_box.append(task)
            ready.set()
            loop.run_until_complete(task)
        except BaseException as exc:
            failure.append(exc)
        finally:
            ready.set()
            if loop_box:
                loop_box[0].close()

    thread = threading.Thread(target=thread_main, name="chaos-clients")
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.2)
    except KeyboardInterrupt:
        log("chaos: interrupted; stopping the clients and the cluster")
        outcome["error"] = "interrupted"
        ready.wait(10)
        if loop_box and task_box:
            loop_box[0].call_soon_threadsafe(task_box[0].cancel)
        thread.join(60)
        raise
    if failure and not isinstance(failure[0], asyncio.CancelledError):
        outcome["error"] = repr(failure[0])
        log(f"chaos: client side failed: {failure[0]!r}")


def member_addresses(backend: Backend) -> dict[int, str]:
    """Client addresses of the group's current members (they change with membership)."""
    return {n: backend.client_address(n) for n in backend.node_ids}


async def _clients(config: RunConfig, backend: Backend, nemeses: list[nemesis_lib.Nemesis],
                   history: History, rng: random.Random, outcome: dict[str, Any],
                   node_state: NodeState, log: Callable[[str], None],
                   loop: asyncio.AbstractEventLoop) -> None:
    addresses = member_addresses(backend)
    security = backend.client_security
    status_of = functools.partial(node_status, security=security)
    t0 = time.monotonic()

    def phase(name: str) -> None:
        outcome.setdefault("phase_times_s", {})[name] = round(time.monotonic() - t0, 3)
        log(f"chaos: {name} at {time.monotonic() - t0:.1f}s")

    if await wait_leader(addresses, config.recovery_timeout, security) is None:
        raise RuntimeError("no leader elected at start")
    workload = Workload(WorkloadSpec(queues=config.queues, rate=config.rate,
                                     producers=config.producers, consumers=config.consumers,
                                     coalesce=config.coalesce),
                        backend.namesrv_address, history, security, list(addresses.values()))
    await workload.setup()
    monitor = None
    if config.retention is not None:
        monitor = RetentionMonitor(addresses, status_of)
        monitor.start()
    try:
        await _exercise(config, backend, nemeses, history, rng, outcome, node_state, log,
                        loop, workload, phase)
    finally:
        if monitor is not None:
            # Also when the run fails half-way: what retention did so far.
            await monitor.stop()
            node_state.retention = monitor.to_json()
            outcome["moved_forward"] = workload.moves
    phase("done")


async def _exercise(config: RunConfig, backend: Backend, nemeses: list[nemesis_lib.Nemesis],
                    history: History, rng: random.Random, outcome: dict[str, Any],
                    node_state: NodeState, log: Callable[[str], None],
                    loop: asyncio.AbstractEventLoop, workload: Workload,
                    phase: Callable[[str], None]) -> None:
    """The workload under the nemeses, the final heal, the drain, convergence."""
    security = backend.client_security
    status_of = functools.partial(node_status, security=security)
    if security.secure:
        outcome["security"] = {"auth": True, "tls": security.tls is not None,
                               "workload_user": workload.acl_user}
    phase("workload")
    await workload.start()

    def leader() -> int | None:
        return asyncio.run_coroutine_threadsafe(
            find_leader(member_addresses(backend), security), loop).result(10)

    ctx = nemesis_lib.Context(backend, rng, leader, log, restarts=node_state.restarts)
    try:
        await run_schedule(nemeses, config.schedule, ctx, history, config.time_limit, rng)
        phase("healed")
        outcome["leader_after_heal"] = await wait_leader(member_addresses(backend),
                                                         config.recovery_timeout, security)
        node_state.final = await _check_nodes(backend, config.final_node_timeout, log)
        # Give sends in flight at the heal a chance to finish against the new leader.
        await asyncio.sleep(2.0)
    finally:
        await workload.stop_producers()
        phase("producers stopped")
        await workload.stop_consumers()
    phase("drain")
    outcome["drained"] = await workload.drain(config.drain_timeout)
    # Nothing stuck afterwards: every node that is up must catch up with the
    # leader's commit (a replica that lost its tail to a power cut included).
    final = node_state.final or {}
    down = [n for n, state in final.items() if not state.get("ready")]
    outcome["convergence"] = await check_converged(member_addresses(backend), status_of,
                                                   config.convergence_timeout, down)
    if not outcome["convergence"]["converged"]:
        log(f"chaos: nodes {outcome['convergence']['behind']} did not catch up with the "
            f"leader's commit {outcome['convergence']['target_commit']}")
    if backend.spec.admin:
        node_state.membership = await _final_membership(backend, workload.spec.topic, log)


async def _final_membership(backend: Backend, topic: str,
                            log: Callable[[str], None]) -> dict[str, Any]:
    """After the drain: the leader's configuration, what the harness believed, the
    topic's route, and the operator's view through the NameServer."""
    api = MemberApi(backend, log)
    view = await asyncio.to_thread(api.leader_view)
    routed = await route_nodes(backend, topic)
    cli = await asyncio.to_thread(member_list_cli, backend)
    return {"configuration": configuration(view), "believed": backend.node_ids,
            "removed": backend.removed, "route_nodes": routed, "cli": cli}


async def route_nodes(backend: Backend, topic: str) -> list[int] | None:
    """The nodes the NameServer routes `topic` to (by client address), None if unread."""
    host, port = split_host_port(backend.namesrv_address)
    by_address = {backend.client_address(n): n for n in backend.all_node_ids}
    try:
        async with asyncio.timeout(10):
            client = await RpcClient.connect(host, port, role="admin", name="chaos-route",
                                             timeout=5.0,
                                             **backend.client_security.anonymous().as_admin())
            try:
                route = await client.request(RequestCode.GET_ROUTE, {"topic": topic})
            finally:
                await client.close()
    except (OSError, TimeoutError, LedgerMQError):
        return None
    nodes = {by_address.get(n.get("address"), -1) for g in route.get("groups", [])
             for n in g.get("nodes", [])}
    return sorted(nodes)


def member_list_cli(backend: Backend) -> dict[str, Any]:
    """`ledgermq member list --json` through the NameServer's admin app, as an operator."""
    argv = [sys.executable, "-m", "ledgermq.cli", "member", "list", "--json",
            "--admin", backend.namesrv_admin_url]
    if backend.security is not None:
        argv += ["--access-key", "admin", "--secret-file", str(backend.security.admin_secret_file),
                 "--tls-ca-file", str(backend.security.ca_file)]
    try:
        status, output = backend.run_on(backend.node_ids[0], argv, timeout=60.0)
    except Exception as exc:  # reported as the operator's view failing
        return {"error": repr(exc), "configuration": None}
    if status != 0:
        return {"error": f"exit status {status}: {output[-1000:]}", "configuration": None}
    try:
        answer = json.loads(output[output.index("{"):])
    except ValueError:
        return {"error": f"not JSON: {output[-1000:]}", "configuration": None}
    views = answer.get("groups", {"": answer})
    view = views.get(backend.spec.group) or next(iter(views.values()), None)
    return {"error": None, "configuration": configuration(view)}


async def _check_nodes(backend: Backend, timeout: float,
                       log: Callable[[str], None]) -> dict[int, dict[str, Any]]:
    """Every node's state after the final heal: alive and answering PING, or why not."""
    final: dict[int, dict[str, Any]] = {}
    for node in backend.node_ids:  # the members: removed nodes are gone on purpose
        ready = await asyncio.to_thread(backend.wait_node, node, timeout)
        final[node] = ready.as_dict()
        if not ready.ready:
            log(f"chaos: node {node} is down after the final heal: {ready.reason}")
    return final


def main_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
