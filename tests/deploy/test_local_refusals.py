"""`python -m deploy.local` (`make run`) refuses, in one line and before starting anything,
a run its demo model cannot play: a tool-call format the tiny model is not taught."""

from __future__ import annotations

from pathlib import Path

from deploy import local
from deploy.wiring import demo_format_problem


def test_a_format_the_demo_model_is_not_taught_is_refused(tmp_path, capsys):
    for setting in ("envserver.tool_format=mistral", "actor.env.tool_format=mistral"):
        assert local.main([f"local.runs_dir={tmp_path}", setting]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "tool-call format 'mistral'" in line and "'hermes'" in line
        assert not any(tmp_path.iterdir())  # nothing was started, no run directory made


def test_any_format_goes_with_a_model_of_the_users_own():
    demo = Path("/repo/demo/model")
    assert demo_format_problem("hermes", str(demo), demo) is None
    assert demo_format_problem("llama3_json", "/models/llama-3.1-8b", demo) is None
    assert demo_format_problem("llama3_json", str(demo), demo) is not None
