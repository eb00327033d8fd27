"""The bound a run trains under, step by step (learner/bound.py): a fixed bound stays and
leaves the algorithm alone; an "auto" bound moves with the controller, switches the
off-policy correction with it and comes back from a checkpoint's state. A group is consumed
by the bound in force when it was released, which it carries, not by today's; the
dispatcher admits and tags releases by the bound in force."""

from __future__ import annotations

import msgspec
import pytest

from learner.batching import Group
from learner.bound import StalenessBound, algorithm_for
from learner.config import LearnerConfig
from learner.dispatcher import PromptStream, num_releasable
from learner.steps import decide_group
from learner.trainer.config import AlgorithmConfig
from tests.learner.builders import trajectory

STARVED = {"wait_s": 6.0, "train_s": 2.0}
HEALTHY = {"clip_fraction": 0.0, "approx_kl": 0.0, "num_loss_tokens": 10}


def _config(**fields) -> LearnerConfig:
    return LearnerConfig.model_validate({"model_path": "m", **fields})


def _group(version: int, released_under: int) -> Group:
    """Two samples whose policy tokens are all of `version`, released under a bound."""
    return Group("g", 0, "calculator", [
        trajectory(trajectory_id=f"g-{i}", group_id="g", sample_index=i, reward=float(i),
                   max_staleness=released_under, versions=[-1, -1, version, version])
        for i in range(2)
    ])  # fmt: skip


@pytest.mark.parametrize(
    ("released_under", "today", "stale"),
    [
        (3, 1, False),  # released when 3 versions were allowed: trained, though today 1 is
        (1, 3, True),  # released under 1: stale at 3 versions old, though today 3 is allowed
        (-1, 3, False),  # an actor that does not say: the learner's own bound
        (-1, 1, True),
    ],
)
def test_a_group_is_consumed_by_the_bound_it_was_released_under(released_under, today, stale):
    decision = decide_group(_group(3, released_under), version=6, max_staleness=today)
    assert (decision.drop_reason == "stale") is stale
    token_rule = decide_group(
        _group(3, released_under), version=6, max_staleness=today, staleness_rule="token"
    )
    assert (token_rule.drop_reason == "stale") is stale


def test_the_dispatcher_admits_and_tags_releases_by_the_bound_in_force():
    rows = [{"env_class": "calculator", "prompt": [{"role": "user", "content": str(i)}]}
            for i in range(40)]  # fmt: skip
    stream = PromptStream(rows, run_id="r", group_size=2, prompts_per_step=2, max_staleness=1)
    admitted = dict(num_released=0, num_dropped_groups=0, prompts_per_step=2)
    assert num_releasable(version=3, max_staleness=stream.max_staleness, **admitted) == 10
    task = stream.task(9, version=3)  # step 4 at v3 under bound 1
    assert (task.step, task.min_version, task.max_staleness) == (4, 3, 1)
    stream.max_staleness = 3  # the bound rose
    assert num_releasable(version=3, max_staleness=stream.max_staleness, **admitted) == 14
    task = stream.task(13, version=3)  # step 6 at v3 under bound 3
    assert (task.step, task.min_version, task.max_staleness) == (6, 3, 3)


def test_an_auto_bound_turns_the_correction_on_above_one():
    plain = AlgorithmConfig()
    assert not plain.needs_proximal
    above = algorithm_for(plain, 2)
    assert (above.ratio_anchor, above.importance_weight) == ("proximal", "tis")
    at_one = algorithm_for(above, 1)
    assert (at_one.ratio_anchor, at_one.importance_weight) == ("behaviour", "none")
    assert not at_one.needs_proximal  # no recomputation's forward at bound 1
    decoupled = AlgorithmConfig(ratio_anchor="proximal", importance_weight="decoupled")
    assert algorithm_for(decoupled, 3) is decoupled  # the configured correction, as it is
    gspo = AlgorithmConfig(policy_loss="gspo", loss_reduction="seq_mean_token_mean")
    assert algorithm_for(gspo, 3) is gspo and algorithm_for(gspo, 1) is gspo


def test_a_fixed_bound_stays_and_leaves_the_algorithm_alone():
    bound = StalenessBound(_config(max_staleness=2))
    for _ in range(4):
        assert bound.after_step(**STARVED, metrics=HEALTHY) == 2
    assert bound.current == 2 and bound.algorithm() is None and bound.state() is None


def test_an_auto_bound_rises_when_starved_and_resumes_from_its_state():
    config = _config(max_staleness="auto", max_staleness_limit=3)
    bound = StalenessBound(config)
    assert bound.current == 1 and bound.algorithm().ratio_anchor == "behaviour"
    # The first step waited for the engines to start: not counted.
    assert [bound.after_step(**STARVED, metrics=HEALTHY) for _ in range(4)] == [1, 1, 2, 2]
    assert bound.algorithm().importance_weight == "tis"
    resumed = StalenessBound(config, bound.state())
    assert resumed.current == 2
    assert resumed.after_step(**STARVED, metrics=HEALTHY) == 2  # its first step: not counted
    assert resumed.after_step(**STARVED, metrics=HEALTHY) == 3  # its window went on
    assert resumed.after_step(**STARVED, metrics={"clip_fraction": 0.5}) == 2  # unhealthy


def test_an_auto_bound_reads_the_time_in_tools_from_the_steps_groups():
    def groups(env_s: float, generate_s: float) -> list[Group]:
        timing = {"env_s": env_s, "generate_s": generate_s}
        timed = [msgspec.structs.replace(t, timing=timing) for t in _group(3, 1).trajectories]
        return [Group("g", 0, "calculator", timed)]

    engine_bound = StalenessBound(_config(max_staleness="auto"))
    steps = [engine_bound.after_step(**STARVED, metrics=HEALTHY, groups=groups(0.1, 4.0))
             for _ in range(5)]  # fmt: skip
    assert steps == [1] * 5  # starved, but on generation: the bound stays
    tool_bound = StalenessBound(_config(max_staleness="auto"))
    steps = [tool_bound.after_step(**STARVED, metrics=HEALTHY, groups=groups(3.0, 1.0))
             for _ in range(3)]  # fmt: skip
    assert steps == [1, 1, 2]  # the first step is not counted


def test_an_auto_bound_is_sized_for_its_limit():
    assert _config(max_staleness="auto", max_staleness_limit=5).staleness_ceiling == 5
    assert _config(max_staleness=2).staleness_ceiling == 2
    with pytest.raises(ValueError, match="max_staleness"):
        _config(max_staleness="fast")
