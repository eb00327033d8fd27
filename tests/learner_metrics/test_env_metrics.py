from dataclasses import dataclass

import pytest

from learner.env_metrics import rollout_metrics, time_in_tools
from tests.learner_metrics.builders import group, trajectory

LONG = (20, 21, 22)  # 3 response tokens
SHORT = (20, 21)  # 2 response tokens


def _mixed_batch():
    """Two environments, one error episode in a calculator group, one all-error sql group."""
    g1 = group(
        "g1",
        dict(
            reward=1.0,
            num_turns=2,
            num_tool_calls=1,
            response_ids=LONG,
            env_metrics={"tool_errors": 0},
        ),
        dict(reward=0.0, env_metrics={"tool_errors": 1}),
        dict(reward=0.0, env_metrics={"tool_errors": 0}),
        dict(
            reward=1.0,
            num_turns=2,
            num_tool_calls=1,
            response_ids=LONG,
            env_metrics={"tool_errors": 0},
        ),
    )
    g2 = group(
        "g2",
        dict(reward=0.0, env_metrics={"tool_errors": 0}),
        dict(reward=0.0, stop_reason="length", env_metrics={"tool_errors": 0}),
        dict(reward=0.0, env_metrics={"tool_errors": 0}),
        dict(
            reward=0.0,
            stop_reason="error:env_step",
            num_turns=7,
            num_tool_calls=9,
            response_ids=(1,) * 50,
            env_metrics={"tool_errors": 5},
        ),
    )
    sql = dict(env_class="sql", num_turns=3, num_tool_calls=2, response_ids=(1, 2, 3, 4))
    g3 = group("g3", dict(reward=0.5, **sql), dict(reward=1.0, stop_reason="max_turns", **sql))
    g4 = group(
        "g4",
        dict(reward=0.0, env_class="sql", stop_reason="error:env_open"),
        dict(reward=0.0, env_class="sql", stop_reason="error:env_open"),
    )
    return [g1, g2, g3, g4]


def test_per_environment_metrics_by_hand():
    m = rollout_metrics(_mixed_batch())
    # calculator: g1 rewards 1,0,0,1; g2 valid rewards 0,0,0 plus one error episode.
    assert m["env/calculator/num_prompts"] == 2
    assert m["env/calculator/num_samples"] == 8
    assert m["env/calculator/samples_per_prompt"] == 4
    assert m["env/calculator/pass_at_n"] == pytest.approx(1 / 2)
    assert m["env/calculator/pass_at_1"] == pytest.approx((2 / 4 + 0 / 3) / 2)
    assert m["env/calculator/mean_reward"] == pytest.approx(2 / 7)
    assert m["env/calculator/variance_per_prompt"] == pytest.approx((0.25 + 0.0) / 2)
    assert m["env/calculator/frac_groups_with_signal"] == pytest.approx(1 / 2)
    assert m["env/calculator/mean_turns"] == pytest.approx((2 + 1 + 1 + 2 + 1 + 1 + 1) / 7)
    assert m["env/calculator/mean_tool_calls"] == pytest.approx(2 / 7)
    assert m["env/calculator/mean_response_tokens"] == pytest.approx((3 + 2 + 2 + 3 + 6) / 7)
    assert m["env/calculator/error_fraction"] == pytest.approx(1 / 8)
    assert m["env/calculator/stop_reason/stop"] == pytest.approx(6 / 8)
    assert m["env/calculator/stop_reason/length"] == pytest.approx(1 / 8)
    assert m["env/calculator/stop_reason/error:env_step"] == pytest.approx(1 / 8)
    assert m["env/calculator/env_metrics/tool_errors"] == pytest.approx(1 / 7)
    # sql: g3 rewards 0.5, 1.0 (only 1.0 is a success); g4 all errors: no prompt.
    assert m["env/sql/num_prompts"] == 1
    assert m["env/sql/num_samples"] == 4
    assert m["env/sql/pass_at_n"] == 1.0
    assert m["env/sql/pass_at_1"] == pytest.approx(0.5)
    assert m["env/sql/mean_reward"] == pytest.approx(0.75)
    assert m["env/sql/variance_per_prompt"] == pytest.approx(0.0625)  # (0.25^2 + 0.25^2) / 2
    assert m["env/sql/frac_groups_with_signal"] == 1.0
    assert m["env/sql/mean_turns"] == 3
    assert m["env/sql/mean_tool_calls"] == 2
    assert m["env/sql/mean_response_tokens"] == 4
    assert m["env/sql/error_fraction"] == pytest.approx(2 / 4)
    assert m["env/sql/stop_reason/error:env_open"] == pytest.approx(2 / 4)
    assert m["env/sql/stop_reason/max_turns"] == pytest.approx(1 / 4)


def test_overall_metrics_by_hand():
    m = rollout_metrics(_mixed_batch())
    assert m["all/num_prompts"] == 3
    assert m["all/num_samples"] == 12
    assert m["all/samples_per_prompt"] == 3
    assert m["all/pass_at_n"] == pytest.approx(2 / 3)
    assert m["all/pass_at_1"] == pytest.approx((0.5 + 0.0 + 0.5) / 3)
    assert m["all/mean_reward"] == pytest.approx(3.5 / 9)
    assert m["all/variance_per_prompt"] == pytest.approx((0.25 + 0.0 + 0.0625) / 3)
    assert m["all/frac_groups_with_signal"] == pytest.approx(2 / 3)
    assert m["all/mean_turns"] == pytest.approx(15 / 9)
    assert m["all/mean_tool_calls"] == pytest.approx(6 / 9)
    assert m["all/mean_response_tokens"] == pytest.approx(24 / 9)
    assert m["all/error_fraction"] == pytest.approx(3 / 12)
    assert m["stop_reason/stop"] == pytest.approx(7 / 12)
    assert m["stop_reason/length"] == pytest.approx(1 / 12)
    assert m["stop_reason/max_turns"] == pytest.approx(1 / 12)
    assert m["stop_reason/error:env_step"] == pytest.approx(1 / 12)
    assert m["stop_reason/error:env_open"] == pytest.approx(2 / 12)
    assert sum(v for k, v in m.items() if k.startswith("stop_reason/")) == pytest.approx(1.0)
    assert "all/stop_reason/stop" not in m and "all/env_metrics/tool_errors" not in m


def test_success_threshold_is_a_parameter():
    m = rollout_metrics(_mixed_batch(), success_threshold=0.5)
    assert m["env/sql/pass_at_1"] == 1.0  # 0.5 now counts
    assert m["env/calculator/pass_at_1"] == pytest.approx(0.25)  # rewards are 0 or 1


def test_equal_rewards_give_no_signal_and_pass_at_n_equals_pass_at_1_for_one_sample():
    same = group("s", *[dict(reward=1.0)] * 4)
    single = group("one", dict(reward=1.0))
    failed = group("f", dict(reward=0.0))
    m = rollout_metrics([same, single, failed])
    assert m["all/variance_per_prompt"] == 0.0
    assert m["all/frac_groups_with_signal"] == 0.0
    solo = rollout_metrics([single, failed])
    assert solo["all/pass_at_n"] == solo["all/pass_at_1"] == 0.5


def test_binary_rewards_variance_peaks_at_a_quarter():
    half = group("h", *[dict(reward=r) for r in (1.0, 0.0, 1.0, 0.0)])
    one_of_four = group("q", *[dict(reward=r) for r in (1.0, 0.0, 0.0, 0.0)])
    assert rollout_metrics([half])["all/variance_per_prompt"] == pytest.approx(0.25)
    assert rollout_metrics([one_of_four])["all/variance_per_prompt"] == pytest.approx(0.1875)


def test_all_error_scope_reports_counts_not_nan_means():
    m = rollout_metrics([group("e", dict(reward=0.0, stop_reason="error:env_open"))])
    assert m == {
        "env/calculator/num_samples": 1.0,
        "env/calculator/error_fraction": 1.0,
        "env/calculator/samples_per_prompt": 1.0,
        "env/calculator/num_prompts": 0.0,
        "env/calculator/stop_reason/error:env_open": 1.0,
        "all/num_samples": 1.0,
        "all/error_fraction": 1.0,
        "all/samples_per_prompt": 1.0,
        "all/num_prompts": 0.0,
        "stop_reason/error:env_open": 1.0,
    }


def test_prefix_and_group_objects():
    @dataclass
    class Held:  # the shape of learner.batching.Group: trajectories under `.trajectories`
        trajectories: list

    groups = [group("a", dict(reward=1.0), dict(reward=0.0))]
    plain = rollout_metrics(groups)
    prefixed = rollout_metrics([Held(groups[0])], prefix="eval/")
    assert prefixed == {f"eval/{k}": v for k, v in plain.items()}
    assert prefixed["eval/env/calculator/pass_at_1"] == 0.5
    assert rollout_metrics([]) == {}


def test_bad_groups_are_rejected():
    with pytest.raises(ValueError, match="no trajectories"):
        rollout_metrics([[]])
    mixed = [trajectory(reward=1.0), trajectory(reward=0.0, env_class="sql", sample_index=1)]
    with pytest.raises(ValueError, match="mixes environments"):
        rollout_metrics([mixed])


def test_the_time_in_tools_is_the_env_share_of_the_episodes_timed_seconds():
    # 3 s in tools and 1 s generating, then 1 s and 3 s: 4 of 8 timed seconds in tools; an
    # untimed episode adds nothing; an error episode is left out of the rollout metrics.
    g = group(
        "g",
        dict(reward=1.0, timing={"env_s": 3.0, "generate_s": 1.0}),
        dict(reward=0.0, timing={"env_s": 1.0, "generate_s": 3.0}),
        dict(reward=0.0),
        dict(reward=0.0, stop_reason="error:env_step", timing={"env_s": 30.0}),
    )
    assert time_in_tools(g) == time_in_tools(g[:3]) == pytest.approx(0.5)  # the bound's input
    assert rollout_metrics([g])["all/tool_time_fraction"] == pytest.approx(0.5)
    assert time_in_tools(g[2:3]) is None  # nothing timed: not known, not 0
    assert "all/tool_time_fraction" not in rollout_metrics([g[2:3]])
