"""docs/running.md's "Bring your agent", done as a new user does it: the section's files
written to a directory outside the repository, `pip install -e` of the agent's package into
this virtual environment, and one launch of `python -m deploy.local` with the section's
config, from that directory.

Checked: the run finishes with its books balanced (deploy/run_ledger.py); the episodes were
the agent's (its replica served the endpoint, and every trained sample came from calls the
endpoint recorded: the env server hosts no stepped environment); no file of Tether changed.
The package is uninstalled afterwards. The run is shortened on the command line (2 steps of
4 x 4): the plumbing is the point here; that the agent learns as `make run` does is measured
over repeated full runs by bench/agent_workflow.py (docs/benchmarks.md).
"""

from __future__ import annotations

import json

import pytest

from deploy.run_ledger import RunLedger
from tests.e2e.walkthroughs import installed, run_as_user, write_walkthrough

SECTION = "## Bring your agent"
COMMANDS = ["pip install -e ./my-agent", "python -m deploy.local --config my-agent.toml"]
SHORTER = [
    "learner.total_steps=2",
    "learner.prompts_per_step=4",
    "learner.group_size=4",
    "learner.eval_interval=2",
    "local.num_eval_rows=8",
]


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    """The walkthrough, step by step: (the run directory, the launcher's output)."""
    home = tmp_path_factory.mktemp("my-project")
    write_walkthrough(SECTION, COMMANDS, home)
    with installed("my-agent", home):
        launch = run_as_user(
            [*COMMANDS[1].split(), f"local.runs_dir={home / 'runs'}", *SHORTER], home, 900
        )
        assert launch.returncode == 0, (launch.stdout + launch.stderr)[-5000:]
    return (home / "runs" / "latest").resolve(), launch.stdout


def test_the_agent_trained_and_the_books_balance(agent_run):
    run_dir, output = agent_run
    assert "steps (policy versions)  2" in output
    ledger = RunLedger.read(run_dir)
    assert ledger.problems() == []
    assert [line["step"] for line in ledger.trained] == [0, 1]
    assert "hosting calculator" in (run_dir / "logs" / "envserver.log").read_text()
    actor_log = (run_dir / "logs" / "actor.log").read_text()
    assert "agent endpoint serving on http://127.0.0.1:" in actor_log
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert all(r["rollout/env/calculator/num_samples"] > 0 for r in train)
    assert any(r["kind"] == "eval" for r in records)
