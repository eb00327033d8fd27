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


def test_own_data_and_model_that_cannot_be_used_are_refused_in_one_line(tmp_path, capsys):
    """The user's rows and model directory (`local.train_data`, `eval_data`, `model_dir`)."""
    bad_row = tmp_path / "bad.jsonl"
    bad_row.write_text('{"data_source": "x", "env_class": "x", "prompt": []}\n')
    cases = [
        (["local.train_data=rows.jsonl"], "set both, or neither"),
        ([f"local.train_data={bad_row}", f"local.eval_data={bad_row}"], "bad.jsonl:1: prompt"),
        ([f"local.model_dir={tmp_path / 'nothing'}"], "local.model_dir"),
        (["local.model_dir=Qwen/Qwen2.5-0.5B"], "is not a directory"),
    ]
    for overrides, says in cases:
        assert local.main([f"local.runs_dir={tmp_path / 'runs'}", *overrides]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) <= 2, err  # a config error: 2
    assert not (tmp_path / "runs").exists()  # nothing was started, no run directory made
