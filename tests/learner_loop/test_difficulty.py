"""Online difficulty filtering (learner/difficulty.py) and the prompt stream that uses it
(learner/dispatcher.py): saturated rows are visited at `keep`, deterministically under a
seed; outcomes count against the row each prompt came from; the state survives a
checkpoint and a write-ahead, so a resumed stream releases what the lost one did."""

from __future__ import annotations

from collections import Counter

import pytest

from learner.difficulty import DifficultyConfig, DifficultyFilter, has_signal
from learner.dispatcher import PromptStream
from tests.learner_loop.test_dispatcher import _rows

SOLVED, MIXED = [1.0, 1.0, 1.0], [1.0, 0.0, 1.0]


def _stream(rows=10, *, keep=0.25, window=2, seed=0) -> PromptStream:
    config = DifficultyConfig(enabled=True, keep=keep, window=window)
    difficulty = DifficultyFilter(config, seed)
    return PromptStream(_rows(rows), run_id="r", group_size=3, prompts_per_step=2,
                        max_staleness=1, seed=seed, difficulty=difficulty)  # fmt: skip


def _visit_epoch(stream: PromptStream, first: int, rewards_of) -> list[int]:
    """Release and take one dataset's worth of prompts from index `first`; their rows."""
    rows = [stream.row_of(i) for i in range(first, first + len(stream.rows))]
    for i, row in zip(range(first, first + len(rows)), rows, strict=True):
        stream.taken(f"r-{i}", rewards_of(row))
    return rows


def test_a_row_is_saturated_after_window_groups_without_signal_and_recovers():
    difficulty = DifficultyFilter(DifficultyConfig(enabled=True, window=2))
    assert has_signal(MIXED) and not has_signal(SOLVED) and not has_signal([0.0, 0.0])
    difficulty.observe(3, SOLVED)
    assert not difficulty.saturated(3)  # one group is not a trend
    difficulty.observe(3, [0.0, 0.0, 0.0])
    assert difficulty.saturated(3)  # all solved, then all failed: no signal either way
    difficulty.observe(3, MIXED)
    assert not difficulty.saturated(3)


def test_saturated_rows_are_visited_at_keep_and_the_rest_as_before():
    stream = _stream(rows=10, keep=0.25)
    easy = set(range(5))  # rows 0-4 always solved; 5-9 give signal

    def outcome(row):
        return SOLVED if row in easy else MIXED

    for epoch in range(2):  # two visits each: rows 0-4 saturated after these
        assert sorted(_visit_epoch(stream, 10 * epoch, outcome)) == list(range(10))
    later = Counter()
    for epoch in range(2, 42):
        later.update(_visit_epoch(stream, 10 * epoch, outcome))
    hard_visits = sum(later[r] for r in range(5, 10)) / 5
    easy_visits = sum(later[r] for r in easy) / 5
    # Each pass over the order visits a signal row once and a saturated one with p = 0.25.
    assert easy_visits / hard_visits == pytest.approx(0.25, abs=0.08)
    assert stream.difficulty.num_skipped > 0
    assert stream.report()["difficulty/saturated/calculator"] == 0.5
    assert stream.rows_in_flight == {}  # every prompt taken was counted once


def test_the_same_seed_and_outcomes_give_the_same_prompts():
    def run(seed):
        stream = _stream(seed=seed)
        return [row for e in range(6) for row in _visit_epoch(stream, 10 * e, lambda r: SOLVED)]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_a_group_dropped_for_a_problem_counts_for_nothing():
    stream = _stream(window=1)
    row = stream.row_of(0)
    stream.taken("r-0", None)  # stale, errors, unused: its rewards say nothing of the row
    assert not stream.difficulty.saturated(row) and stream.rows_in_flight == {}


def test_a_resumed_stream_releases_what_the_lost_one_did():
    """Checkpoint after 20 prompts, 6 more written ahead (4 taken after the checkpoint),
    then a crash: the resumed stream has the checkpoint's outcomes, the rows of every
    prompt in flight, and goes on from the write-ahead's position exactly as the lost one."""
    lost = _stream()
    for e in range(2):
        _visit_epoch(lost, 10 * e, lambda r: SOLVED)
    checkpoint = lost.state()
    ahead = [lost.row_of(i) for i in range(20, 26)]
    write_ahead = lost.state()
    for i in range(20, 24):
        lost.taken(f"r-{i}", SOLVED)  # after the checkpoint: come back after the resume
    resumed = _stream()
    resumed.restore(checkpoint, write_ahead, checkpointed=20)
    assert [resumed.row_of(i) for i in range(20, 26)] == ahead  # the same tasks again
    assert resumed.difficulty.state()["recent"] == checkpoint["recent"]
    for i in range(20, 26):  # redelivered after the resume: each counted once
        resumed.taken(f"r-{i}", SOLVED)
    for i in range(24, 26):
        lost.taken(f"r-{i}", SOLVED)
    assert resumed.difficulty.recent == lost.difficulty.recent
    assert [resumed.row_of(i) for i in range(26, 40)] == [lost.row_of(i) for i in range(26, 40)]


def test_without_the_switch_the_stream_is_as_before():
    plain = PromptStream(_rows(5), run_id="r", group_size=8, prompts_per_step=2, max_staleness=1)
    assert plain.state() is None and plain.report() == {}
    plain.taken("r-0", SOLVED)  # nothing to count
    assert [plain.row_of(i) for i in range(5)] == [plain._row_at(i) for i in range(5)]
