"""common/supervision.py: backoff and budget worked out by hand."""

from __future__ import annotations

import pydantic
import pytest

from common.supervision import (
    EXIT_CONFIG,
    EXIT_GAVE_UP,
    Events,
    RestartPolicy,
    RestartTracker,
    Supervised,
    Verdict,
    event_line,
    read_events,
)

POLICY = RestartPolicy(
    initial_backoff_s=1.0, max_backoff_s=4.0, budget=3, window_s=100.0, healthy_after_s=10.0
)


def test_a_crash_loop_doubles_the_backoff_up_to_its_cap_then_spends_the_budget():
    tracker = RestartTracker(RestartPolicy(**{**POLICY.model_dump(), "budget": 5}))
    # Each run lasts 2 s (< healthy_after_s): a crash loop.
    assert tracker.on_exit(started_at=0.0, exited_at=2.0) == 3.0  # + 1
    assert tracker.on_exit(started_at=3.0, exited_at=5.0) == 7.0  # + 2
    assert tracker.on_exit(started_at=7.0, exited_at=9.0) == 13.0  # + 4
    assert tracker.on_exit(started_at=13.0, exited_at=15.0) == 19.0  # + 8 capped at 4
    assert tracker.on_exit(started_at=19.0, exited_at=21.0) == 25.0
    assert tracker.on_exit(started_at=25.0, exited_at=27.0) is None  # 5 restarts in 100 s
    assert tracker.num_restarts == 5


def test_a_process_that_ran_healthy_starts_a_new_streak():
    tracker = RestartTracker(POLICY)
    assert tracker.on_exit(started_at=0.0, exited_at=1.0) == 2.0
    assert tracker.on_exit(started_at=2.0, exited_at=3.0) == 5.0  # streak 2: + 2
    # Ran 10 s (healthy): the next restart waits the initial backoff again.
    assert tracker.on_exit(started_at=5.0, exited_at=15.0) == 16.0
    assert tracker.crash_streak == 1


def test_restarts_older_than_the_window_leave_the_budget():
    tracker = RestartTracker(POLICY)
    for exited_at in (10.0, 30.0, 50.0):  # each after a healthy run: backoff stays 1 s
        assert tracker.on_exit(started_at=exited_at - 15.0, exited_at=exited_at) == exited_at + 1
    assert tracker.on_exit(started_at=95.0, exited_at=109.0) is None  # 3 in (9, 109]
    # At 111 the restart at 10 is 101 s old: out of the window, one restart is free again.
    assert tracker.on_exit(started_at=95.0, exited_at=111.0) == 112.0
    assert tracker.restarts == [30.0, 50.0, 111.0]


def test_budget_zero_never_restarts():
    tracker = RestartTracker(RestartPolicy(budget=0))
    assert tracker.on_exit(started_at=0.0, exited_at=1000.0) is None


def test_policy_fields_are_validated():
    with pytest.raises(pydantic.ValidationError, match="window_s"):
        RestartPolicy(window_s=0)
    with pytest.raises(pydantic.ValidationError, match="budget"):
        RestartPolicy(budget=-1)


def test_the_verdicts_of_a_role():
    learner = Supervised(POLICY, finishes=True)
    assert learner.started(0.0) == 0
    assert learner.exited(0, 5.0) == Verdict("finished")
    assert learner.exited(EXIT_CONFIG, 5.0) == Verdict(
        "gave_up", reason="cannot start as configured"
    )
    # A supervisor below gave up already: a restart would stack a second budget on its own.
    assert learner.exited(EXIT_GAVE_UP, 5.0).action == "gave_up"
    # Lost with its node (no code) or killed: restarted after the backoff.
    assert learner.exited(None, 5.0) == Verdict("restart", restart_at=6.0)
    assert learner.started(6.0) == 1 and learner.num_restarts == 1
    server = Supervised(RestartPolicy(budget=1, initial_backoff_s=0.5))
    server.started(0.0)
    assert server.exited(0, 1.0) == Verdict("restart", restart_at=1.5)  # exit 0 is no finish
    server.started(1.5)
    verdict = server.exited(-9, 2.0)
    assert verdict.action == "gave_up" and "restart budget spent (1 in 600s" in verdict.reason


def test_events_are_one_line_each_and_read_back(tmp_path):
    events = Events(tmp_path / "events.jsonl")
    record = events.write("actor/replica-0", "started", pid=7, restart=0)
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"role": "actor", "ev')  # a line another process is writing
    assert read_events(tmp_path) == [record]
    assert set(record) == {"time", "role", "event", "pid", "restart"}
    assert Events(None).write("x", "started", pid=1)["role"] == "x"  # by hand: nowhere
    assert read_events(tmp_path / "nothing") == []


def test_an_elastic_fleets_changes_are_shown_as_lines():
    scaled = {"role": "run", "event": "scaled", "replicas": 2, "was": 1, "work": 8.0}
    assert event_line(scaled) == "fleet: 1 -> 2 actor replicas (8 groups released and not finished)"
    leaving = {"role": "actor-1", "event": "leaving", "pid": 7}
    assert event_line(leaving) == (
        "fleet: actor-1 leaving, its episodes handed back at their next turn"
    )
    assert event_line({"role": "actor-1", "event": "left", "code": 0}) is None  # as asked
    assert event_line({"role": "actor-1", "event": "left", "code": -9}) == (
        "fleet: actor-1 left with code -9"
    )
    assert event_line({"role": "actor-1", "event": "placed"}) is None
