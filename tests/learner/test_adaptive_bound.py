"""The adaptive staleness bound (learner/staleness.py `AdaptiveBound`): it rises while the
learner starves with healthy metrics, falls when health crosses a limit, keeps within
[1, ceiling], moves by one a step at most, and comes back the same from a checkpoint."""

import pytest

from learner.config import BoundLimits
from learner.staleness import AdaptiveBound

HEALTHY = {"clip_fraction": 0.05, "approx_kl": 0.01}
STARVED = {"wait_s": 6.0, "train_s": 2.0}  # 75% of the step waiting on data
FED = {"wait_s": 0.1, "train_s": 2.0}


def _run(bound: AdaptiveBound, steps: list[tuple[dict, dict]]) -> list[int]:
    return [bound.observe(**times, health=health) for times, health in steps]


def test_it_rises_by_one_every_two_starved_healthy_steps_up_to_the_ceiling():
    bound = AdaptiveBound(ceiling=3)
    assert _run(bound, [(STARVED, HEALTHY)] * 7) == [1, 2, 2, 3, 3, 3, 3]


def test_a_fed_learner_keeps_its_bound():
    bound = AdaptiveBound(ceiling=4, bound=2)
    assert _run(bound, [(FED, HEALTHY)] * 5) == [2] * 5
    short_wait = {"wait_s": 1.0, "train_s": 2.0}  # 33% alone, 1.1 / 5.1 = 22% with a fed step
    assert _run(bound, [(short_wait, HEALTHY), (FED, HEALTHY), (short_wait, HEALTHY)]) == [2] * 3


def test_data_that_arrives_in_bursts_counts_over_the_window():
    # A step that waited 2 s, then one whose groups were all there: neither alone says
    # much, together the learner waited half its time.
    bound = AdaptiveBound(ceiling=4)
    burst = [({"wait_s": 2.0, "train_s": 1.0}, HEALTHY), ({"wait_s": 0.0, "train_s": 1.0}, HEALTHY)]
    assert _run(bound, burst * 3) == [1, 2, 2, 3, 3, 4]


def test_a_starved_learner_raises_the_bound_only_while_its_episodes_wait_on_tools():
    # Generation the bottleneck (5% of the episodes' time in tools): more episodes in flight
    # would only queue in the engines, so the bound stays however long the learner waits.
    def starved(tool_fraction: float | None, steps: int, bound: AdaptiveBound) -> list[int]:
        return [bound.observe(**STARVED, health=HEALTHY, tool_fraction=tool_fraction)
                for _ in range(steps)]  # fmt: skip

    limits = BoundLimits(min_tool_fraction=0.2)
    engine_bound = AdaptiveBound(ceiling=4, limits=limits)
    assert starved(0.05, 6, engine_bound) == [1] * 6
    assert starved(0.6, 3, engine_bound) == [2, 2, 3]  # tools took over: the window was full
    assert starved(0.2, 2, AdaptiveBound(ceiling=4, limits=limits)) == [1, 2]  # at the limit
    assert starved(None, 2, AdaptiveBound(ceiling=4, limits=limits)) == [1, 2]  # not known


def test_time_in_tools_counts_over_the_same_window_as_the_wait():
    # One step whose episodes read high (a tail of slow calls) beside one that did not: the
    # window's episodes spent 0.25 of their time in tools, under the limit, so no rise.
    bound = AdaptiveBound(ceiling=4, limits=BoundLimits(min_tool_fraction=0.35))
    steps = [bound.observe(**STARVED, health=HEALTHY, tool_fraction=f) for f in (0.05, 0.45)]
    assert steps == [1, 1]
    assert bound.observe(**STARVED, health=HEALTHY, tool_fraction=0.45) == 2  # 0.45 and 0.45


def test_a_checkpoint_without_tool_fractions_resumes_with_them_unknown():
    restored = AdaptiveBound.from_state({"bound": 2, "window": [[6.0, 2.0]]}, ceiling=4)
    assert restored.window == [(6.0, 2.0, None)]
    assert restored.observe(**STARVED, health=HEALTHY, tool_fraction=0.5) == 3


@pytest.mark.parametrize("sick", [{"clip_fraction": 0.3}, {"approx_kl": 0.2}])
def test_it_falls_at_once_when_health_crosses_a_limit_but_not_below_one(sick):
    bound = AdaptiveBound(ceiling=4, bound=3)
    assert _run(bound, [(STARVED, {**HEALTHY, **sick})] * 3) == [2, 1, 1]
    assert not bound.needs_correction()


def test_off_policy_correction_is_needed_past_bound_one():
    bound = AdaptiveBound(ceiling=4)
    assert not bound.needs_correction()
    _run(bound, [(STARVED, HEALTHY)] * 2)
    assert bound.bound == 2 and bound.needs_correction()


def test_the_limits_are_the_callers():
    strict = BoundLimits(starved_wait_fraction=0.9, starved_steps=1, max_clip_fraction=0.01)
    bound = AdaptiveBound(ceiling=4, limits=strict)
    assert _run(bound, [(STARVED, {"clip_fraction": 0.0})]) == [1]  # 75% < 90%: not starved
    assert _run(bound, [({"wait_s": 10.0, "train_s": 0.5}, {"clip_fraction": 0.0})]) == [2]
    assert _run(bound, [(STARVED, {"clip_fraction": 0.02})]) == [1]


def test_a_checkpointed_controller_continues_where_it_stopped():
    bound = AdaptiveBound(ceiling=4)
    _run(bound, [(STARVED, HEALTHY)] * 3)  # bound 2, one starved step in its window
    resumed = AdaptiveBound.from_state(bound.state(), ceiling=4)
    assert (resumed.bound, resumed.window) == (2, [(6.0, 2.0, None)])
    assert _run(resumed, [(STARVED, HEALTHY)]) == _run(bound, [(STARVED, HEALTHY)]) == [3]
    lowered = AdaptiveBound.from_state(bound.state(), ceiling=2)
    assert lowered.bound == 2


def test_a_ceiling_under_one_is_refused():
    with pytest.raises(ValueError, match="ceiling of at least 1"):
        AdaptiveBound(ceiling=0)
