"""Admission arithmetic of the dispatcher, on hand-worked cases."""

import pytest

from learner.dispatcher import (
    PromptStream,
    eval_tasks,
    new_run_id,
    num_releasable,
    run_of,
    step_of_release,
)


def _rows(n):
    return [
        {
            "data_source": "calculator",
            "env_class": "calculator",
            "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
            "reward_spec": {"ground_truth": str(i + 1)},
            "extra_info": {"task_key": f"k{i}"},
        }
        for i in range(n)
    ]


def test_synchronous_bound_releases_one_step_at_a_time():
    # max_staleness 0, P = 4: at v=0 exactly step 0's four prompts; nothing more until v=1.
    kw = dict(num_dropped_groups=0, prompts_per_step=4, max_staleness=0)
    assert num_releasable(version=0, num_released=0, **kw) == 4
    assert num_releasable(version=0, num_released=4, **kw) == 0
    assert num_releasable(version=1, num_released=4, **kw) == 4


def test_staleness_two_allows_three_steps_ahead():
    kw = dict(num_dropped_groups=0, prompts_per_step=8, max_staleness=2)
    assert num_releasable(version=0, num_released=0, **kw) == 24
    assert num_releasable(version=5, num_released=56, **kw) == 8  # (5+2+1)*8 - 56


def test_each_dropped_group_is_replaced_once():
    kw = dict(prompts_per_step=4, max_staleness=1)
    assert num_releasable(version=3, num_released=20, num_dropped_groups=0, **kw) == 0
    assert num_releasable(version=3, num_released=20, num_dropped_groups=2, **kw) == 2


def test_step_tags_never_exceed_the_admitted_horizon():
    kw = dict(prompts_per_step=4, max_staleness=1)
    assert [step_of_release(i, version=0, **kw) for i in range(10)] == [0] * 4 + [1] * 6


def test_prompt_stream_is_deterministic_and_covers_each_epoch():
    stream = PromptStream(_rows(5), run_id="r", group_size=8, prompts_per_step=2, max_staleness=1)
    again = PromptStream(_rows(5), run_id="r", group_size=8, prompts_per_step=2, max_staleness=1)
    tasks = [stream.task(i, version=10) for i in range(10)]
    assert tasks == [again.task(i, version=10) for i in range(10)]
    first_epoch = {t.extra_info["task_key"] for t in tasks[:5]}
    assert first_epoch == {f"k{i}" for i in range(5)}
    assert [t.task_id for t in tasks[:2]] == ["r-0", "r-1"]
    assert tasks[2].step == 1 and tasks[2].min_version == 0
    assert all(t.group_size == 8 and not t.is_eval for t in tasks)


def test_eval_tasks_pin_the_version():
    tasks = eval_tasks(_rows(3), run_id="r", version=7, samples_per_prompt=4)
    assert [(t.is_eval, t.min_version, t.group_size) for t in tasks] == [(True, 7, 4)] * 3


def test_empty_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="empty"):
        PromptStream([], run_id="r", group_size=2, prompts_per_step=1, max_staleness=0)


def test_releases_stop_at_the_last_step_but_still_replace_drops():
    # total 5 steps, P = 2, max_staleness 2: at v=3 the horizon would be step 5; capped at 5
    # steps (0..4) = 10 prompts; a drop still earns a replacement.
    kw = dict(prompts_per_step=2, max_staleness=2, total_steps=5)
    assert num_releasable(version=3, num_released=10, num_dropped_groups=0, **kw) == 0
    assert num_releasable(version=3, num_released=10, num_dropped_groups=1, **kw) == 1
    assert num_releasable(version=1, num_released=0, num_dropped_groups=0, **kw) == 8


def test_the_run_of_a_task_id_is_the_run_that_made_it():
    """learner/intake.py names an earlier run's stragglers by it, once per run."""
    run = new_run_id("calc-a")  # the namespace has a '-' of its own
    stream = PromptStream(_rows(20), run_id=run, group_size=2, prompts_per_step=2,
                          max_staleness=1)  # fmt: skip
    ids = [stream.task(i, version=0).task_id for i in (0, 17)]
    ids += [t.task_id for t in eval_tasks(_rows(3), run_id=run, version=30, samples_per_prompt=1)]
    assert {run_of(task_id) for task_id in ids} == {run}
    assert run_of("calc-7") == "calc"  # a run from before run ids: its namespace
