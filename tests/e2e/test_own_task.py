"""docs/running.md's "Train on your own task", done as a new user does it: the files of that
section written to a directory outside the repository, `pip install -e` of the package into
this virtual environment, `learner prepare --from` its dataset entry point, and one launch of
`python -m deploy.local` with the one config file, from that directory.

Checked: the run finishes; its books balance (deploy/run_ledger.py); both of the user's
tasks were trained on, one hosted by entry point and one by import path; no file of Tether
changed. The package is uninstalled afterwards. The run is shortened on the command line
(2 steps of 4 x 4): the plumbing is the point, the learning is the demo's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy.run_ledger import RunLedger
from tests.e2e.walkthroughs import installed, run_as_user, write_walkthrough

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Train on your own task"
COMMANDS = [
    "pip install -e ./my-tasks",
    "learner prepare --from words --size 400 --seed 0 --eval-fraction 0.05 --output-dir data",
    "python -m deploy.local --config my-task.toml",
]
SHORTER = [
    "learner.total_steps=2",
    "learner.prompts_per_step=4",
    "learner.group_size=4",
    "learner.eval_interval=2",
    "learner.eval_samples_per_prompt=2",
]


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    """The walkthrough, step by step: (the user's directory, the run directory, outputs)."""
    home = tmp_path_factory.mktemp("my-project")
    write_walkthrough(SECTION, COMMANDS, home)
    with installed("my-tasks", home):
        prepare = run_as_user(COMMANDS[1].split(), home, 120)
        assert prepare.returncode == 0, prepare.stderr
        launch = run_as_user(
            [*COMMANDS[2].split(), f"local.runs_dir={home / 'runs'}", *SHORTER], home, 900
        )
        assert launch.returncode == 0, (launch.stdout + launch.stderr)[-5000:]
    return home, (home / "runs" / "latest").resolve(), prepare.stdout, launch.stdout


def test_prepare_found_the_dataset_by_entry_point(user_run):
    _, _, prepared, _ = user_run
    counts = {line.split()[0]: line.split()[1:] for line in prepared.splitlines()[1:]}
    assert set(counts) == {"length", "reverse", "total"}
    assert int(counts["total"][0]) + int(counts["total"][1]) == 400


def test_the_run_trained_both_tasks_and_its_books_balance(user_run):
    _, run_dir, _, output = user_run
    assert "steps (policy versions)  2" in output
    ledger = RunLedger.read(run_dir)
    assert ledger.problems() == []
    assert [line["step"] for line in ledger.trained] == [0, 1]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    seen = {
        key.split("/")[2]
        for record in records
        if record["kind"] in ("train", "eval")
        for key in record
        if key.startswith(("rollout/env/", "eval/env/")) and key.endswith("/num_samples")
    }
    # `reverse` by its entry point, `length` by the reward's import path.
    assert seen == {"length", "reverse"}
    hosting = (run_dir / "logs" / "envserver.log").read_text()
    assert "hosting length,reverse" in hosting


def test_the_plugin_settings_reached_the_environment(user_run):
    """`tries = 2`: a wrong first answer of `reverse` gets a second turn."""
    _, run_dir, _, _ = user_run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    turns = [
        record[key]
        for record in records
        for key in record
        if key.startswith(("rollout/env/reverse/", "eval/env/reverse/"))
        and key.endswith("/mean_turns")
    ]
    assert turns and all(1.0 <= t <= 2.0 for t in turns)
    assert max(turns) > 1.0
