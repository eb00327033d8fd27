"""Group decisions of a training step and the history truncation of a resume, by hand."""

import math

import msgspec
import pytest

from learner.batching import Group
from learner.ledger import Ledger
from learner.reporting import truncate_lines
from learner.steps import decide_group, empty_step_warning, staleness_of
from tests.learner.builders import trajectory


def _group(*versions_per_sample, stop_reasons=None) -> Group:
    """One sample per entry: a 2-token prompt (version -1), then tokens of those versions."""
    trajectories = []
    for i, versions in enumerate(versions_per_sample):
        t = trajectory(
            trajectory_id=f"g-{i}",
            group_id="g",
            group_size=len(versions_per_sample),
            sample_index=i,
            token_ids=list(range(2 + len(versions))),
            versions=[-1, -1, *versions],
        )
        if stop_reasons:
            t = msgspec.structs.replace(t, stop_reason=stop_reasons[i])
        trajectories.append(t)
    return Group("g", 0, "calculator", trajectories)


def test_group_at_the_bound_is_trained_one_older_is_dropped():
    # version 5, max_staleness 2: oldest token 3 is allowed, 2 is not.
    fresh = decide_group(_group([3, 4], [5, 5]), version=5, max_staleness=2)
    assert fresh.drop_reason is None and len(fresh.group.trajectories) == 2
    stale = decide_group(_group([5, 5], [2, 5]), version=5, max_staleness=2)
    assert (stale.group, stale.drop_reason) == (None, "stale")


def test_synchronous_bound_takes_only_the_current_version():
    assert decide_group(_group([4], [4]), version=4, max_staleness=0).drop_reason is None
    assert decide_group(_group([4], [3]), version=4, max_staleness=0).drop_reason == "stale"


def test_tokens_newer_than_the_learner_come_from_a_lost_branch():
    # After a resume to version 4, an actor still holds the lost run's version 5.
    decision = decide_group(_group([4], [5]), version=4, max_staleness=3)
    assert decision.drop_reason == "future"


def test_error_samples_are_removed_and_reported_or_sink_the_group():
    group = _group([1], [1], [1], stop_reasons=["stop", "error:env", "length"])
    decision = decide_group(group, version=1, max_staleness=0)
    assert [t.trajectory_id for t in decision.group.trajectories] == ["g-0", "g-2"]
    assert decision.removed == {"errors": ("g-1",)}
    lonely = _group([1], [1], stop_reasons=["stop", "error:env"])
    assert decide_group(lonely, version=1, max_staleness=0).drop_reason == "errors"


def _rewarded(*rewards: float, stop_reasons=None) -> Group:
    group = _group(*([1] for _ in rewards), stop_reasons=stop_reasons)
    trajectories = [
        msgspec.structs.replace(t, reward=r)
        for t, r in zip(group.trajectories, rewards, strict=True)
    ]
    return Group("g", 0, "calculator", trajectories)


def test_dynamic_sampling_filters_a_group_whose_samples_all_got_one_reward():
    rules = dict(version=1, max_staleness=0, filter_no_signal=True)
    assert decide_group(_rewarded(1.0, 1.0, 1.0), **rules).drop_reason == "filtered"
    assert decide_group(_rewarded(0.0, 0.0), **rules).drop_reason == "filtered"
    assert decide_group(_rewarded(0.0, 1.0, 1.0), **rules).drop_reason is None
    # Only the trainable samples count: an error sample's 0 is no signal.
    errored = _rewarded(1.0, 0.0, 1.0, stop_reasons=["stop", "error:env", "stop"])
    assert decide_group(errored, **rules).drop_reason == "filtered"
    # Off (the default, and past learner.max_filtered_per_step): trained as it is.
    assert decide_group(_rewarded(1.0, 1.0), version=1, max_staleness=0).drop_reason is None


def test_a_stale_group_is_stale_before_it_is_filtered():
    stale = decide_group(_rewarded(1.0, 1.0), version=3, max_staleness=0, filter_no_signal=True)
    assert stale.drop_reason == "stale"


def _sample(i: int, **fields):
    """Sample i of a 4-sample group: 2 prompt tokens, 2 loss tokens of version 1."""
    values = dict(token_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], versions=[-1, -1, 1, 1])
    values.update({"reward": float(i), **fields})
    stop_reason = values.pop("stop_reason", "stop")
    t = trajectory(trajectory_id=f"s-{i}", group_id="s", group_size=4, sample_index=i, **values)
    return msgspec.structs.replace(t, stop_reason=stop_reason)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"reward": math.nan}, "nonfinite_reward"),
        ({"reward": -math.inf}, "nonfinite_reward"),
        ({"logprobs": [0.0, 0.0, -0.5, math.nan]}, "nonfinite_logprobs"),
        ({"logprobs": [0.0, 0.0, -math.inf, -0.5]}, "nonfinite_logprobs"),
        ({"token_ids": [5, 6, 7, 300]}, "bad_tokens"),  # vocabulary of 300: ids 0..299
        ({"token_ids": [5, -1, 7, 8]}, "bad_tokens"),
        ({"loss_mask": [0, 0, 1, 7]}, "bad_loss_mask"),
    ],
)
def test_a_sample_with_impossible_contents_is_removed_under_its_reason(fields, reason):
    samples = [_sample(0), _sample(1, **fields), _sample(2), _sample(3)]
    decision = decide_group(Group("s", 0, "calculator", samples), **AT_V1)
    assert decision.drop_reason is None
    assert [t.trajectory_id for t in decision.group.trajectories] == ["s-0", "s-2", "s-3"]
    assert decision.removed == {reason: ("s-1",)}
    assert decision.group.rewards == [0.0, 2.0, 3.0]  # the advantages never see the bad one


def test_a_non_finite_logprob_outside_the_loss_mask_does_not_matter():
    odd = _sample(1, logprobs=[math.nan, 0.0, -0.5, -0.5])  # a prompt token: never trained
    decision = decide_group(Group("s", 0, "calculator", [_sample(0), odd]), **AT_V1)
    assert decision.drop_reason is None and decision.removed == {}


def test_a_group_left_with_one_trainable_sample_is_dropped_under_the_commonest_problem():
    samples = [
        _sample(0, reward=math.nan),
        _sample(1, reward=math.inf),
        _sample(2),
        _sample(3, stop_reason="error:env_step"),
    ]
    decision = decide_group(Group("s", 0, "calculator", samples), **AT_V1)
    assert (decision.group, decision.drop_reason) == (None, "nonfinite_reward")


AT_V1 = {"version": 1, "max_staleness": 0, "vocab_size": 300}


def test_staleness_is_counted_from_the_oldest_policy_token():
    assert staleness_of(_group([3, 6], [5]), version=7) == 4
    assert staleness_of(_group([], []), version=7) == 0  # no policy token at all


def test_resume_cuts_history_back_to_the_checkpointed_lines(tmp_path):
    path = tmp_path / "trained.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n{"st')  # killed mid-line
    truncate_lines(path, 2)
    assert path.read_text() == '{"step": 0}\n{"step": 1}\n'
    truncate_lines(path, 0)
    assert path.read_text() == ""
    truncate_lines(tmp_path / "missing.jsonl", 3)  # nothing to cut
    assert not (tmp_path / "missing.jsonl").exists()


def test_a_step_without_loss_tokens_is_counted_and_said_with_its_stop_reasons():
    """The scale ladder's 0.5B probe (bench/scale.py): a random model never ends its turn,
    every response is cut at max_tokens, overlong filtering masks them all, and three steps
    learned nothing."""
    ledger = Ledger()
    assert ledger.train(8, [0, 0], num_loss_tokens=120)
    assert not ledger.train(8, [0, 0], num_loss_tokens=0)
    assert ledger.num_steps_without_loss_tokens == 1
    assert ledger.totals()["steps_without_loss_tokens"] == 1
    assert Ledger.from_cursor(ledger.to_cursor()).num_steps_without_loss_tokens == 1
    cut = _group([0, 0], [0, 0], [0, 0], stop_reasons=["length", "length", "stop"])
    text = empty_step_warning(7, [cut])
    assert text.startswith("step 7 had no loss token in any of its 3 samples")
    assert "(stop reasons: length 2, stop 1)" in text and "overlong_filtering" in text


def test_filtered_groups_earn_replacements_and_a_line_apart_from_the_drops():
    ledger = Ledger(num_released=4)
    ledger.take_group(dropped_reason="filtered")
    ledger.drop("filtered", 4)
    ledger.take_group(dropped_reason="stale")
    ledger.drop("stale", 4)
    assert ledger.num_dropped_groups == 2  # both replaced
    totals = ledger.totals()
    assert (totals["dropped"], totals["filtered"]) == (4, 4)
    assert totals["dropped_by_reason"] == {"stale": 4}
    assert Ledger.from_cursor(ledger.to_cursor()).totals() == totals  # resumed, the same
