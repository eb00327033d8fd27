"""deploy/run_ledger.py on hand-written run records: the books balance, and each way they
can fail to is named."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from deploy.run_ledger import RunLedger


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


STALE_DROP = {"version": 1, "group_id": "r-2", "reason": "stale", "whole_group": True,
              "trajectory_ids": ["2a", "2b"]}  # fmt: skip


def _run(tmp_path: Path, drop_lines: list[dict] = (STALE_DROP,), **done_changes) -> Path:
    """Two steps of two groups of two, one group dropped stale and replaced (prompt 4),
    one eval of 1 prompt x 2 samples, 2 eval samples of a lost learner's eval."""
    trained = [
        {
            "step": 0,
            "version": 1,
            "group_ids": ["r-0", "r-1"],
            "trajectory_ids": ["0a", "0b", "1a", "1b"],
        },
        {
            "step": 1,
            "version": 2,
            "group_ids": ["r-3", "r-4"],
            "trajectory_ids": ["3a", "3b", "4a", "4b"],
        },
    ]
    done = {
        "kind": "done",
        "run_id": "r",
        "version": 2,
        "released_groups": 5,
        "trained": 8,
        "dropped": 2,
        "dropped_by_reason": dict(
            Counter(d["reason"] for d in drop_lines for _ in d["trajectory_ids"])
        ),
        "filtered": 0,
        "eval_trajectories": 4,
        "malformed": 0,
        "stream_messages_stored": 15,
        "stream_messages_left": 1,
        **done_changes,
    }
    records = [
        {"kind": "train", "step": 0, "version": 1},
        {"kind": "eval", "version": 2, "num_prompts": 1, "samples_per_prompt": 2},
        {"kind": "train", "step": 1, "version": 2},
        done,
    ]
    _write(tmp_path / "metrics.jsonl", records)
    _write(tmp_path / "trained.jsonl", trained)
    _write(tmp_path / "dropped.jsonl", list(drop_lines))
    return tmp_path


def test_a_balanced_run_has_no_problems_and_sums_by_hand(tmp_path):
    ledger = RunLedger.read(_run(tmp_path))
    assert ledger.problems() == []
    assert ledger.summary() == {
        "prompts_released": 5,
        "groups_taken": 5,
        "stored": 15,  # 8 trained + 2 dropped + 4 eval + 0 malformed + 1 left
        "trained": 8,
        "dropped": 2,
        "dropped_by_reason": {"stale": 2},
        "filtered": 0,
        "eval": 4,
        "eval_recorded": 2,
        "malformed": 0,
        "left_in_stream": 1,
        "versions": 2,
        "resumed_episodes": 0,  # a done record from before episode checkpoints counts none
        "resumed_turns": 0,
        "resumed_tokens": 0,
    }


def test_a_group_dropped_whole_for_any_reason_is_taken(tmp_path):
    """A group with under two valid samples goes for its most common problem, `errors`
    included (a hung env server's episodes; a fresh-clone fault suite once failed on it)."""
    dropped = [{**STALE_DROP, "reason": "errors"}]
    assert RunLedger.read(_run(tmp_path, dropped)).problems() == []


def test_samples_removed_from_a_trained_group_do_not_take_it(tmp_path):
    """The error samples of a trained group are dropped, the group is not: prompt r-2,
    of which only that line speaks, was never taken."""
    dropped = [{**STALE_DROP, "reason": "errors", "whole_group": False}]
    problems = RunLedger.read(_run(tmp_path, dropped)).problems()
    assert problems == ["released prompts never trained or dropped: ['r-2'] (1)"]


def test_a_filtered_group_is_taken_and_its_own_line(tmp_path):
    """Dynamic sampling's groups without signal: taken, replaced, and their own line of the
    books (stored = trained + dropped + filtered + eval + malformed + left)."""
    filtered = [{**STALE_DROP, "reason": "filtered"}]
    ledger = RunLedger.read(_run(tmp_path, filtered, dropped=0, filtered=2, dropped_by_reason={}))
    assert ledger.problems() == []
    summary = ledger.summary()
    assert (summary["dropped"], summary["filtered"], summary["dropped_by_reason"]) == (0, 2, {})


@pytest.mark.parametrize(
    ("done_changes", "problem"),
    [
        ({"released_groups": 6}, "released prompts never trained or dropped: ['r-5']"),
        ({"stream_messages_stored": 16}, "stored 16 != trained 8"),
        ({"trained": 7}, "totals disagree"),
        ({"filtered": 2, "stream_messages_stored": 17}, "totals disagree"),
        ({"dropped_by_reason": {"future": 2}}, "drop reasons disagree"),
        ({"eval_trajectories": 1, "stream_messages_stored": 12}, "eval samples recorded 2"),
        ({"version": 3}, "versions are not 1..3"),
    ],
)
def test_each_imbalance_is_named(tmp_path, done_changes, problem):
    problems = RunLedger.read(_run(tmp_path, **done_changes)).problems()
    assert any(problem in p for p in problems), problems


def test_a_trajectory_trained_twice_is_named(tmp_path):
    run = _run(tmp_path)
    lines = (run / "trained.jsonl").read_text().splitlines()
    second = json.loads(lines[1])
    second["trajectory_ids"][0] = "0a"
    (run / "trained.jsonl").write_text(lines[0] + "\n" + json.dumps(second) + "\n")
    assert any("trained twice: ['0a']" in p for p in RunLedger.read(run).problems())


def test_a_run_without_a_done_record_is_an_error(tmp_path):
    _write(tmp_path / "metrics.jsonl", [{"kind": "train", "step": 0, "version": 1}])
    with pytest.raises(ValueError, match="never finished"):
        RunLedger.read(tmp_path)
