"""common/waiting.py: the backoff, the log cadence and the bound, worked out by hand."""

from __future__ import annotations

from common.waiting import Waiting


def test_backoff_doubles_to_its_cap_and_the_last_try_lands_on_the_deadline():
    waiting = Waiting(started_at=100.0, timeout_s=10.0, first_s=0.25, max_s=5.0)
    delays = []
    now = 100.0
    while not (step := waiting.failed(now)).give_up:
        delays.append(step.delay_s)
        now += step.delay_s
    # 0.25, 0.5, 1, 2, 4 (7.75 s waited), then 5 capped at the 2.25 s left.
    assert delays == [0.25, 0.5, 1.0, 2.0, 4.0, 2.25]
    assert now == 110.0 and step.waited_s == 10.0


def test_one_line_at_the_first_failure_then_one_every_30s():
    waiting = Waiting(started_at=0.0, first_s=5.0, max_s=5.0)  # no timeout: for ever
    said = [t for t in range(0, 125, 5) if waiting.failed(float(t)).say]
    assert said == [0, 30, 60, 90, 120]


def test_without_a_timeout_it_never_gives_up():
    waiting = Waiting(started_at=0.0)
    assert not any(waiting.failed(t * 3600.0).give_up for t in range(100))
