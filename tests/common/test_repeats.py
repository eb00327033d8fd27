"""common/repeats.py: a repeating warning is a line at once, then one per window with a count."""

from __future__ import annotations

import logging

from common.repeats import Repeats


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_occurrence_is_said_then_one_line_per_window_counts_the_rest(caplog):
    clock = _Clock()
    repeats = Repeats(every_s=30.0, clock=clock)
    log = logging.getLogger("tests.repeats")
    with caplog.at_level(logging.WARNING, logger="tests.repeats"):
        for _ in range(10):  # one every 3 s: 0 .. 27 s, all inside the first window
            repeats.warning(log, "store at %s unreachable", "h:1")
            clock.now += 3.0
        assert [r.getMessage() for r in caplog.records] == ["store at h:1 unreachable"]
        clock.now = 100.0 + 45.0
        repeats.warning(log, "store at %s unreachable", "h:1")  # 10 unsaid since, and this one
    assert [r.getMessage() for r in caplog.records] == [
        "store at h:1 unreachable",
        "store at h:1 unreachable (10 times in 45 s)",
    ]
    assert all(r.exc_info is None for r in caplog.records)


def test_happened_counts_what_a_line_stands_for():
    clock = _Clock()
    repeats = Repeats(every_s=30.0, clock=clock)
    assert repeats.happened() == 1
    clock.now += 29.9
    assert repeats.happened() == 0
    clock.now += 0.1  # 30 s after the first line
    assert repeats.happened() == 2
    clock.now += 300.0  # quiet for a while: the next one is said at once, alone
    assert repeats.happened() == 1
