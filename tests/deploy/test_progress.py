"""What a user sees of a run: pure functions over metrics.jsonl records, the progress line
(common/progress.py: `make run`, the Ray driver and a learner started by hand show it) and
the end of a run (deploy/progress.py)."""

import json

import pytest

from common.progress import ProgressView, progress_line
from common.supervision import Events
from deploy import progress


def _train(version, wall_s, reward=0.5, staleness=1):
    return {
        "kind": "train",
        "version": version,
        "wall_s": wall_s,
        "reward_mean": reward,
        "max_staleness_seen": staleness,
        "tokens_per_s": 2000.0,
        "trained": 64 * version,
        "dropped": 0,
    }


def _eval(version, wall_s, pass_at_1):
    return {
        "kind": "eval",
        "version": version,
        "wall_s": wall_s,
        "pass_at_1": pass_at_1,
        "num_prompts": 100,
        "samples_per_prompt": 2,
    }


def test_time_left_follows_the_pace_since_the_first_step():
    first = _train(1, wall_s=80.0)
    line = progress_line(first, total_steps=30, last_eval=None, first=first)
    assert "01:20 elapsed, ~--:-- left" in line and "eval pass@1 --" in line
    # 10 s per step after the first, 20 steps to go: 200 s (start-up is not extrapolated).
    line = progress_line(
        _train(10, wall_s=170.0), total_steps=30, last_eval=_eval(5, 120.0, 0.79), first=first
    )
    assert line.startswith("step  10/30 | v  10 | reward 0.50 | eval pass@1 0.79 (v5)")
    assert "02:50 elapsed, ~03:20 left" in line


def test_summary_from_records():
    records = [
        _eval(0, 60.0, 0.41),
        _train(1, 80.0, reward=0.4, staleness=0),
        _train(2, 90.0, reward=0.9),
        _eval(2, 95.0, 0.9),
        {
            "kind": "done",
            "wall_s": 100.0,
            "stream_messages_stored": 528,
            "trained": 128,
            "dropped": 0,
            "dropped_by_reason": {},
        },
    ]
    summary = progress.summarize(records)
    assert summary["eval_pass1_start"] == 0.41 and summary["eval_pass1_end"] == 0.9
    assert summary["eval_pass1_gain"] == pytest.approx(0.49)
    assert (summary["steps"], summary["wall_s"], summary["max_staleness_seen"]) == (2, 100.0, 1)
    assert (summary["published"], summary["trained"], summary["dropped"]) == (528, 128, 0)
    table = progress.summary_table(summary)
    assert "eval pass@1 at end       0.900" in table and "wall time                01:40" in table


def test_a_run_without_steps_or_evals_has_no_summary():
    with pytest.raises(ValueError, match="nothing to summarize"):
        progress.summarize([_eval(0, 60.0, 0.4)])


def test_plot_is_written(tmp_path):
    records = [_eval(0, 60.0, 0.41), _train(1, 80.0), _train(2, 90.0), _eval(2, 95.0, 0.9)]
    path = progress.plot(records, tmp_path / "progress.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_line_says_what_prefix_sharing_saved():
    shared = {**_train(3, 30.0), "train/prefix_sharing_ratio": 2.08}
    assert "2,000 tok/s (shared prefixes x2.1) |" in progress_line(
        shared, total_steps=30, last_eval=None
    )
    nothing_shared = {**_train(3, 30.0), "train/prefix_sharing_ratio": 1.0}
    assert "2,000 tok/s |" in progress_line(nothing_shared, total_steps=30, last_eval=None)


def test_progress_line_says_how_many_groups_dynamic_sampling_filtered():
    filtered = {**_train(3, 30.0), "filtered_groups": 3}
    line = progress_line(filtered, total_steps=30, last_eval=None)
    assert "(filtered 3) |" in line
    assert "filtered" not in progress_line(_train(3, 30.0), total_steps=30, last_eval=None)


def test_record_tail_starts_over_when_a_resumed_learner_cuts_the_file_back(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = progress.RecordTail(path)
    assert tail.poll() == ([], False)
    path.write_text('{"v": 1}\n{"v": 2}\n{"v": 3}\n{"v": 4')  # the last line half written
    assert tail.poll() == ([{"v": 1}, {"v": 2}, {"v": 3}], False)
    # The learner resumes from a checkpoint that had seen 2 records: a new, shorter file.
    cut = tmp_path / "metrics.jsonl.tmp"
    cut.write_text('{"v": 1}\n{"v": 2}\n')
    cut.replace(path)
    with open(path, "a") as f:
        f.write('{"v": 3, "again": true}\n')
    assert tail.poll() == ([{"v": 1}, {"v": 2}, {"v": 3, "again": True}], True)
    assert tail.poll() == ([], False)


def test_the_run_follower_shows_steps_and_restarts_from_the_run_directory(tmp_path):
    """What `make run` and a run on Ray both print: a line per step from metrics.jsonl and a
    line per supervision decision from events.jsonl, whoever wrote it."""
    events = Events(tmp_path / "events.jsonl")
    events.write("envserver", "exited", pid=9, code=1, restart_in_s=1.0)  # before a resume
    follower = progress.RunFollower(tmp_path, total_steps=30)
    assert follower.poll() == [] and not follower.done
    events.write("actor", "started", pid=10, restart=0)  # a first start: the launcher says it
    events.write("actor/replica-1", "exited", pid=11, code=-9, restart_in_s=1.0)
    events.write("actor/replica-1", "started", pid=12, restart=1)
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.write(json.dumps(_train(1, 80.0)) + "\n")
    lines = follower.poll()
    assert lines[0].startswith("step   1/30")
    assert lines[1:] == [
        "supervisor: actor/replica-1 exited with code -9; restarting in 1.0s",
        "supervisor: actor/replica-1 restarted (pid 12, restart 1)",
    ]
    events.write("learner", "gave_up", pid=13, code=2, reason="cannot start as configured")
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "done", "wall_s": 90.0}) + "\n")
    assert follower.poll() == [
        "supervisor: learner exited with code 2: cannot start as configured; giving up"
    ]
    assert follower.done and [r["kind"] for r in follower.records] == ["train", "done"]


def test_the_view_shows_each_record_once_and_paces_a_restarted_learner_anew():
    view = ProgressView(total_steps=30)
    assert view.lines(_eval(0, 60.0, 0.41)) == [
        "  eval at v0: pass@1 0.410 over 100 prompts x 2 samples"
    ]
    first = view.lines(_train(1, 80.0))[0]
    assert first.startswith("step   1/30 | v   1 | reward 0.50 | eval pass@1 0.41 (v0)")
    assert "~--:-- left" in first
    assert "~04:40 left" in view.lines(_train(2, 90.0))[0]  # 10 s a step, 28 to go
    assert view.lines({"kind": "done", "wall_s": 95.0}) == []
    # A learner restarted from its step-1 checkpoint writes step 2 again, on a new clock.
    view.learner_restarted()
    assert view.lines(_train(2, 5.0)) == []  # shown already
    third = view.lines(_train(3, 9.0))[0]
    assert third.startswith("step   3/30") and "00:09 elapsed, ~--:-- left" in third
    assert "~01:44 left" in view.lines(_train(4, 13.0))[0]  # 4 s a step, 26 to go
