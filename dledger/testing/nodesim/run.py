"""One real-node simulator run, start to end: start the nodes, the client and
the nemesis on virtual time, heal, wait for convergence, run the final checks.

Kept apart from `harness` (which holds the simulated world) so that the
modules that drive or check that world (`nemesis`, `checks`) sit above it in
the import graph instead of being imported from inside a function.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from commitlog import fileio
from dledger.testing.nodesim.checks import final_checks
from dledger.testing.nodesim.compaction import compactor
from dledger.testing.nodesim.connloss import connection_faults
from dledger.testing.nodesim.harness import SPARES, Harness, NodeSimOptions, NodeSimResult
from dledger.testing.nodesim.members import MembershipDriver
from dledger.testing.nodesim.nemesis import nemesis
from dledger.testing.nodesim.runtime_bugs import planted


def run_seed(seed: int, options: NodeSimOptions | None = None,
             trace: Callable[[str], None] | None = None) -> NodeSimResult:
    """Run one seed; the result (and trace) is a pure function of its arguments."""
    options = options or NodeSimOptions()
    h = Harness(seed, options, trace)
    result = NodeSimResult(seed, options.nodes, h.flush)
    with fileio.use(h.fs), planted(options.runtime_bug), _quiet():
        try:
            h.trace(f"seed={seed} nodes={options.nodes} flush={h.flush}"
                    + (f" membership (+{SPARES} spares)" if options.membership else "")
                    + (" open peers" if h.open_peers else "")
                    + (f" connection loss (crashes close {h.close_share})"
                       if h.connection_loss else "")
                    + (f" reserves batch={h.reserve_batch} bytes={h.reserve_bytes}"
                       if h.reserve_batch else ""))
            for slot in h.slots.values():
                h.start(slot)
            h.client_loop.create_task(h.client())
            h.client_loop.create_task(nemesis(h, options.fault_s))
            if options.compaction:
                h.client_loop.create_task(compactor(h, options.fault_s))
            if h.connection_loss:
                h.client_loop.create_task(connection_faults(h, options.fault_s))
            if options.membership:
                h.counts["open_peers_runs"] = int(h.open_peers)
                driver = MembershipDriver(h, h.member_rng, options.nodes, SPARES)
                h.client_loop.create_task(driver.run(options.fault_s))
            stop = lambda: h.violation is not None or h.done  # noqa: E731
            h.scheduler.run_until(options.fault_s, stop)
            if h.violation is None:
                h.heal()
                deadline = options.fault_s + options.heal_s
                h.client_loop.create_task(h.liveness(deadline))
                h.scheduler.run_until(deadline, stop)
            if h.violation is None and not h.done:
                h.fail(f"no convergence within {options.heal_s} s of the heal: "
                       f"{h.converged()}")
            if h.violation is None:
                problem = final_checks(h)
                if problem:
                    h.fail(problem)
            _uncaught(h)
        finally:
            h.done = True
            for loop in [*h.dead_loops, *h.scheduler.loops]:
                loop.bury()
    result.violation = h.violation
    result.trace = h.lines
    result.steps = h.scheduler.steps
    result.virtual_s = round(h.clock.now, 3)
    result.counts = h.fault_counts()
    return result


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Nodes log their (simulated) failures as errors; a run reports through
    its trace instead. Restored afterwards."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def _uncaught(h: Harness) -> None:
    """Any call of a loop's exception handler is an exception that escaped."""
    for loop in [*h.dead_loops, *h.scheduler.loops]:
        for context in loop.errors:
            exc = context.get("exception")
            h.fail(f"uncaught in {loop.name}: {context.get('message')} {exc!r}")
            return
