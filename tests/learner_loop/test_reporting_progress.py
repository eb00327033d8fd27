"""A learner started by hand prints the progress line `make run` shows, from one
home (common/progress.py): the learner's own reporting path (learner/reporting.py) with
`learner.progress = "always"`, against the launcher's follower (deploy/local.py) reading
the metrics.jsonl that path wrote."""

from __future__ import annotations

import io

import pytest

from common.progress import shows_progress
from deploy import local
from deploy.progress import RunFollower
from learner.config import LearnerConfig
from learner.reporting import Reporter

TOTAL_STEPS = 4


class _RolesRunning:
    """The launcher's supervisor as its follower sees it while every role runs."""

    def poll(self) -> None:
        pass

    def finished(self, name: str) -> bool:
        return False

    def given_up(self) -> None:
        return None


def _reporter(run_dir, progress: str) -> Reporter:
    config = LearnerConfig(model_path="unused", total_steps=TOTAL_STEPS, progress=progress)
    return Reporter(config, run_dir, use_wandb=False)


def _train(version: int, wall_s: float) -> dict:
    return {
        "kind": "train",
        "step": version - 1,
        "version": version,
        "wall_s": wall_s,
        "reward_mean": 0.25 * version,
        "max_staleness_seen": 1,
        "tokens_per_s": 1500.0 + version,
        "train/prefix_sharing_ratio": 3.0,
    }


def _run(reporter: Reporter) -> None:
    """A short run's records, through the reporting calls the learner loop makes."""
    reporter.record_eval(0, [], wall_s=4.0, task_keys={})
    for version in range(1, TOTAL_STEPS + 1):
        reporter.record_train(_train(version, 10.0 + 2.5 * version), step=version - 1, groups=[])
        if version == 2:
            reporter.record_eval(2, [], wall_s=16.0, task_keys={})
    reporter.record_done({"kind": "done", "wall_s": 21.0, "version": TOTAL_STEPS})
    reporter.close()


def test_a_learner_started_by_hand_prints_the_lines_make_run_shows(tmp_path, capsys):
    _run(_reporter(tmp_path, "always"))
    printed_by_the_learner = capsys.readouterr().out.splitlines()

    follower = RunFollower(tmp_path, TOTAL_STEPS)
    code = local._follow(_RolesRunning(), follower, timeout_s=10.0, stopping=lambda: False)
    shown_by_make_run = capsys.readouterr().out.splitlines()

    assert code == 0 and len(follower.records) == 7
    assert printed_by_the_learner == shown_by_make_run
    assert [line.split(":")[0].split("|")[0].strip() for line in printed_by_the_learner] == [
        "eval at v0", "step   1/4", "step   2/4", "eval at v2", "step   3/4", "step   4/4"
    ]  # fmt: skip
    # 2.5 s a step since step 1, one step to go.
    assert printed_by_the_learner[-2].endswith(
        "1,503 tok/s (shared prefixes x3.0) | 00:17 elapsed, ~00:02 left"
    )


@pytest.mark.parametrize("setting", ["auto", "never"])
def test_a_learner_whose_stdout_is_not_a_terminal_prints_no_progress(tmp_path, capsys, setting):
    # Under `make run` and in a pod stdout is a log file: the launcher shows the lines itself.
    _run(_reporter(tmp_path, setting))
    assert capsys.readouterr().out == ""
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 7


def test_auto_means_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert shows_progress("auto", Terminal()) and not shows_progress("auto", io.StringIO())
    assert shows_progress("always", io.StringIO()) and not shows_progress("never", Terminal())
