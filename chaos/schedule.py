"""When nemeses strike: fixed on/off periods or random subsets with quiet periods.

Every start and stop is recorded in the history (process "nemesis": an invoke
when the harness begins the action, an info with what was done when it
finishes), and whatever is active when the time is up is stopped: the final
heal before the drain.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from chaos.backend import HarnessError
from chaos.history import NEMESIS, History
from chaos.nemesis import Context, Nemesis


@dataclass(frozen=True)
class Schedule:
    """`fixed`: quiet `off_s`, all nemeses on for `on_s`, repeat. `random`: each
    period a random subset of the nemeses (about a quarter of periods quiet),
    lasting between half and one and a half times `on_s`."""

    kind: str = "fixed"
    on_s: float = 10.0
    off_s: float = 10.0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "random"):
            raise ValueError("schedule must be 'fixed' or 'random'")
        if not self.on_s > 0 or not self.off_s >= 0:  # NaN fails both
            raise ValueError(f"a fault period lasts more than 0 s (--on {self.on_s:g}) and the"
                             f" quiet between them 0 s or more (--off {self.off_s:g})")


async def _act(nemesis: Nemesis, what: str, ctx: Context, history: History) -> None:
    action = nemesis.start if what == "start" else nemesis.stop
    history.record(NEMESIS, "invoke", what, {"nemesis": nemesis.name})
    try:
        detail = await asyncio.to_thread(action, ctx)
    except Exception as exc:
        history.record(NEMESIS, "info", what, {"nemesis": nemesis.name, "error": repr(exc)},
                       error=repr(exc))
        ctx.log(f"chaos: nemesis {nemesis.name} {what} failed: {exc!r}")
        if isinstance(exc, HarnessError):
            raise  # the harness cannot go on truthfully: stop the run
        return
    history.record(NEMESIS, "info", what, {"nemesis": nemesis.name, "detail": detail})
    ctx.log(f"chaos: {nemesis.name} {what}: {detail}")


# A run whose plan is unfinished at its time limit runs on, to this many
# times the limit at most.
OVERTIME_FACTOR = 3.0


async def run_schedule(nemeses: list[Nemesis], schedule: Schedule, ctx: Context,
                       history: History, time_limit: float, rng: random.Random) -> None:
    """Drive the nemeses for `time_limit` seconds, then stop every active one.

    A plan that must be carried out whole (`Nemesis.plan_unfinished`: replace
    every node, grow to five...) and is not when the time limit passes gets
    more periods, in each of which it is chosen, until it is done or
    OVERTIME_FACTOR times the time limit has passed: a random schedule may
    have picked it too rarely, and a plan cut short by the clock says
    nothing about the system (the final check would have called the run
    invalid for a configuration the plan never got to make)."""
    started = time.monotonic()
    deadline = started + time_limit
    active: list[Nemesis] = []

    async def sleep_until(t: float) -> None:
        await asyncio.sleep(max(0.0, min(t, deadline) - time.monotonic()))

    def unfinished() -> list[Nemesis]:
        return [n for n in nemeses if n.plan_unfinished]

    limit, overtime = deadline, started + time_limit * OVERTIME_FACTOR
    try:
        while nemeses:
            now = time.monotonic()
            if now >= limit:
                late = unfinished()
                if not late or now >= overtime:
                    if deadline > limit and not late:
                        # The plan ended in overtime: its aftermath under load.
                        ctx.log("chaos: every plan is carried out")
                        await asyncio.sleep(schedule.off_s)
                    break
                if deadline < overtime:
                    ctx.log(f"chaos: time limit reached with "
                            f"{', '.join(n.name for n in late)} unfinished: periods go on "
                            f"until it is done, {time_limit * OVERTIME_FACTOR:g} s in all "
                            "at most")
                    deadline = overtime
            await sleep_until(time.monotonic() + schedule.off_s)
            if time.monotonic() >= deadline:
                continue  # the time limit, or the overtime's end: decided above
            late = unfinished() if time.monotonic() >= limit else []
            if schedule.kind == "fixed":
                chosen = list(nemeses)
                length = schedule.on_s
            else:
                chosen = [] if rng.random() < 0.25 and not late else \
                    rng.sample(nemeses, rng.randint(1, len(nemeses)))
                chosen += [n for n in late if n not in chosen]
                length = rng.uniform(schedule.on_s / 2, schedule.on_s * 1.5)
            for nemesis in chosen:
                await _act(nemesis, "start", ctx, history)
                active.append(nemesis)
            await sleep_until(time.monotonic() + length)
            for nemesis in _stop_order(active):
                await _act(nemesis, "stop", ctx, history)
            active.clear()
            if all(n.finished for n in nemeses):
                # Every plan is carried out (chaos.membership): one more quiet
                # period under load, so the last step's aftermath is measured.
                ctx.log("chaos: every nemesis has finished its plan")
                await sleep_until(time.monotonic() + schedule.off_s)
                return
        if deadline == limit:
            await sleep_until(deadline)
    finally:
        # The final heal: also after a cancellation (Ctrl-C), nothing stays broken.
        for nemesis in _stop_order(active):
            await asyncio.shield(_act(nemesis, "stop", ctx, history))


def _stop_order(active: list[Nemesis]) -> list[Nemesis]:
    """Last started, first stopped; nemeses that repair at a period's end
    (`stop_last`, the membership nemeses) after the faults are healed."""
    return sorted(reversed(active), key=lambda n: n.stop_last)
