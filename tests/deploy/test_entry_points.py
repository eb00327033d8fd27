"""The console scripts (deploy/entry_points.py): every role's command validates every
section of the file, and the rules between sections, before anything starts; a required
field of another role's section left for its launcher is not an error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.cli import parse_args
from actors.config import ActorConfig
from common.config import load_section
from deploy.entry_points import whole_file_problem

REPO = Path(__file__).resolve().parents[2]
BAD_LEARNER = '[learner]\nmodel_path = "m"\ngroup_size = "eight"\n[actor.engine]\nmodel = "m"\n'


def test_another_roles_invalid_section_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(BAD_LEARNER)
    for role in ("actor", "envserver"):
        problem = whole_file_problem(str(path), [], role=role)
        assert problem == (
            f"invalid config ({path}):\n  learner.group_size: Input should be a valid integer, "
            "unable to parse string as an integer"
        )


def test_a_rule_between_sections_is_checked_by_every_role(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[actor]\nheartbeat_s = 6.0\n[actor.engine]\nmodel = "m"\n')
    problem = whole_file_problem(str(path), [], role="envserver")
    assert "actor.heartbeat_s (6.0) must be at most half of broker.prompt_ack_wait_s" in problem


def test_a_launchers_template_passes_for_the_roles_it_leaves_unfilled():
    # configs/demo.toml leaves learner.model_path and actor.engine.model to the launcher.
    assert whole_file_problem("configs/demo.toml", [], role="envserver") is None
    assert "learner.model_path: Field required" in whole_file_problem(
        "configs/demo.toml", [], role="learner"
    )


@pytest.mark.parametrize("script", ["actor", "envserver"])
def test_the_console_scripts_exit_2_naming_the_key(tmp_path, script):
    path = tmp_path / "c.toml"
    path.write_text(BAD_LEARNER)
    code = f"import sys; from deploy.entry_points import {script}; sys.exit({script}())"
    out = subprocess.run(
        [sys.executable, "-c", code, "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert f"{script}: invalid config" in out.stderr and "learner.group_size" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_help_example_override_is_a_real_key(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "actor.rollout.max_turns=4" in capsys.readouterr().out
    config = load_section(
        ActorConfig, None, "actor", ["actor.engine.model=m", "actor.rollout.max_turns=4"]
    )
    assert config.rollout.max_turns == 4
