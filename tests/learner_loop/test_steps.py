"""Group decisions of a training step and the history truncation of a resume, by hand."""

import msgspec

from learner.batching import Group
from learner.reporting import truncate_lines
from learner.steps import decide_group, staleness_of
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
    assert decision.error_ids == ("g-1",)
    lonely = _group([1], [1], stop_reasons=["stop", "error:env"])
    assert decide_group(lonely, version=1, max_staleness=0).drop_reason == "errors"


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
