"""Membership steps in a history: each step's availability gap, and the final check."""

from __future__ import annotations

from chaos.history import History
from chaos.membership_report import (
    AckTimeline,
    final_problems,
    membership_steps,
    step_gaps,
    summary,
)

S = 1_000_000_000
T0 = 1_000 * S


def acks_every(history: History, start_s: float, end_s: float, every_s: float,
               skip: tuple[float, float] | None = None) -> None:
    """One producer acknowledged every `every_s` seconds, none inside `skip`."""
    t = start_s
    value = int(start_s * 1000)
    while t <= end_s:
        if skip is None or not skip[0] < t < skip[1]:
            value += 1
            history.record(0, "invoke", "send", {"value": value}, time_ns=int(T0 + t * S))
            history.record(0, "ok", "send", {"value": value, "queue": 0, "offset": value},
                           time_ns=int(T0 + t * S) + 1000)
        t = round(t + every_s, 6)


def step(kind: str, start_s: float, end_s: float, *, ok: bool = True, required: bool = True,
         entries: tuple[tuple[str, float], ...] = (), checks: dict | None = None) -> dict:
    anchored = []
    at = T0 + start_s * S
    for action, seconds in entries:
        anchored.append({"action": action, "node_id": 4, "index": 10, "seconds": seconds,
                         "started_ns": int(at), "finished_ns": int(at + seconds * S)})
        at += seconds * S
    return {"step": kind, "nodes": {"old": 1, "new": 4}, "required": required,
            "started_ns": int(T0 + start_s * S), "finished_ns": int(T0 + end_s * S), "ok": ok,
            "changes": [{"action": "replace", "ok": ok, "steps": anchored, "attempts": [{}],
                         "already_done": False, "error": None}],
            "checks": checks or {}, "error": None if ok else "boom",
            "configuration": {"voters": [2, 3, 4], "learners": []}}


def record_step(history: History, at_s: float, detail_steps: list[dict]) -> None:
    history.record("nemesis", "invoke", "start", {"nemesis": "replace-each"},
                   time_ns=int(T0 + at_s * S))
    history.record("nemesis", "info", "start", {"nemesis": "replace-each",
                                                "detail": {"membership": detail_steps}},
                   time_ns=int(T0 + at_s * S) + 1)


def test_a_step_gap_is_the_longest_ackless_window_overlapping_it() -> None:
    history = History()
    # Acks every 0.1 s from 0 to 20 s, none between 5.0 and 6.5 s.
    acks_every(history, 0.0, 20.0, 0.1, skip=(5.0, 6.5))
    record_step(history, 7.0, [step("replace", 4.0, 6.0, entries=(("add_learner", 0.5),
                                                                  ("promote", 0.5),
                                                                  ("remove", 1.0)))])
    [gap] = step_gaps(history.ops)
    assert gap["step"] == "replace" and gap["ok"]
    assert abs(gap["gap_s"] - 1.5) < 0.01, gap  # from the ack at 5.0 to the one at 6.5
    assert abs(gap["gap_from_s"] - 5.0) < 0.01 and abs(gap["gap_to_s"] - 6.5) < 0.01
    assert gap["seconds"] == 2.0
    by_action = {e["action"]: e["gap_s"] for e in gap["entries"]}
    # add_learner 4.0-4.5 (+1 s settle: up to 5.5) overlaps the outage; so does the rest.
    assert abs(by_action["add_learner"] - 1.5) < 0.01
    assert abs(by_action["remove"] - 1.5) < 0.01


def test_a_step_that_disturbed_nothing_has_the_ordinary_spacing() -> None:
    history = History()
    acks_every(history, 0.0, 20.0, 0.1, skip=(15.0, 17.0))
    record_step(history, 5.0, [step("add", 3.0, 4.0, entries=(("add_learner", 0.2),))])
    [gap] = step_gaps(history.ops)
    assert gap["gap_s"] <= 0.11  # the outage at 15-17 s is far from the step
    assert gap["entries"][0]["gap_s"] <= 0.11


def test_a_step_outside_the_load_has_no_gap() -> None:
    history = History()
    acks_every(history, 0.0, 5.0, 0.1)
    timeline = AckTimeline(history.ops)
    assert timeline.gap(int(T0 + 30 * S), int(T0 + 31 * S))["gap_s"] is None


def test_steps_are_read_from_nemesis_infos_only() -> None:
    history = History()
    acks_every(history, 0.0, 2.0, 0.5)
    record_step(history, 1.0, [step("replace", 0.5, 0.9)])
    history.record("nemesis", "info", "start", {"nemesis": "kill", "detail": {"killed": [1]}},
                   time_ns=T0 + 2 * S)
    history.record("nemesis", "info", "stop", {"nemesis": "grow", "detail": {"idle": "done"}},
                   time_ns=T0 + 3 * S)
    assert [s["nemesis"] for s in membership_steps(history.ops)] == ["replace-each"]
    steps = step_gaps(history.ops)
    assert summary(steps) == {"replace": {"steps": 1, "ok": 1,
                                          "longest_gap_s": steps[0]["gap_s"]}}


FINAL = {"voters": [4, 5, 6], "learners": [], "index": 40, "pending": False}


def problems(steps: list[dict] | None = None, final: dict | None = FINAL,
             believed: list[int] | None = None, intended: dict | None = None,
             route: list[int] | None = None, cli: dict | None = None) -> list[str]:
    return final_problems(steps or [], final, [4, 5, 6] if believed is None else believed,
                          intended, [4, 5, 6] if route is None else route,
                          {"configuration": FINAL} if cli is None else cli)


def gaps_of(*steps: dict) -> list[dict]:
    history = History()
    acks_every(history, 0.0, 10.0, 0.1)
    record_step(history, 9.0, list(steps))
    return step_gaps(history.ops)


def test_a_clean_end_has_no_problems() -> None:
    assert problems(gaps_of(step("replace", 1, 2)),
                    intended={"voters": [4, 5, 6], "count": 3}) == []


def test_a_failed_plan_step_is_a_problem_a_refused_churn_step_is_not() -> None:
    [why] = problems(gaps_of(step("replace", 1, 2, ok=False)))
    assert "membership step replace" in why and "failed" in why
    assert problems(gaps_of(step("remove", 1, 2, ok=False, required=False))) == []


def test_the_final_configuration_must_be_the_intended_one() -> None:
    assert any("intended [1, 2, 3]" in p for p in
               problems(intended={"voters": [1, 2, 3], "count": 3}))
    assert any("intended 5" in p for p in problems(intended={"voters": None, "count": 5}))
    assert any("not committed" in p for p in problems(final={**FINAL, "pending": True}))
    assert any("learners left" in p for p in
               problems(final={**FINAL, "learners": [7]}, believed=[4, 5, 6, 7],
                        cli={"configuration": {**FINAL, "learners": [7]}}))
    assert any("no leader answered" in p for p in problems(final=None))


def test_the_harness_view_the_route_and_the_operator_view_must_agree() -> None:
    assert any("harness's view [1, 4, 5, 6]" in p for p in problems(believed=[1, 4, 5, 6]))
    assert any("lists nodes [1]" in p for p in problems(route=[1, 4, 5, 6]))
    assert any("member list` through the NameServer shows" in p
               for p in problems(cli={"configuration": {"voters": [1, 2, 3], "learners": []}}))
    assert any("member list` through the NameServer failed" in p
               for p in problems(cli={"configuration": None, "error": "exit status 1"}))


def test_a_wiped_node_the_leader_never_flagged_is_a_problem() -> None:
    flagged = step("wipe", 1, 2, checks={"identity_mismatch_seen": True})
    missed = step("wipe", 3, 4, checks={"identity_mismatch_seen": False})
    missed["nodes"] = {"node": 2}
    assert problems(gaps_of(flagged)) == []
    assert any("wiped node 2 was never flagged" in p for p in problems(gaps_of(missed)))
    # Churn may wipe a node the leader is cut off from: reported in the step,
    # not a reason (a node that never catches up fails the convergence check).
    churn = step("wipe", 3, 4, required=False, checks={"identity_mismatch_seen": False})
    assert problems(gaps_of(churn)) == []
