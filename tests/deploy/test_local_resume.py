"""`python -m deploy.local --resume`: which run it names and what refuses it, without
starting anything (the resume itself: tests/faults/test_resume_run.py)."""

from __future__ import annotations

import json

import pytest

from deploy import local


def _run(runs_dir, name: str, launched: dict | None = None):
    run_dir = runs_dir / name
    run_dir.mkdir(parents=True)
    if launched is not None:
        (run_dir / local.LAUNCH_FILE).write_text(json.dumps(launched))
    return run_dir


def test_latest_and_a_path_name_the_run_and_what_started_it(tmp_path):
    launched = {"config": "/c/demo.toml", "overrides": ["learner.total_steps=3"]}
    run_dir = _run(tmp_path, "20261126-080000", launched)
    (tmp_path / "latest").symlink_to(run_dir.name)
    assert local.resumed_run(tmp_path, "latest") == (run_dir, launched)
    assert local.resumed_run(tmp_path / "elsewhere", str(run_dir)) == (run_dir, launched)


def test_a_directory_the_launcher_did_not_make_is_refused_by_name(tmp_path):
    not_a_run = _run(tmp_path, "data")
    with pytest.raises(ValueError, match=r"--resume .*data: not a run directory of this launcher"):
        local.resumed_run(tmp_path, str(not_a_run))


def test_the_cli_says_so_in_one_line_and_exits_2(tmp_path, capsys):
    code = local.main(["--resume", str(tmp_path / "missing"), f"local.runs_dir={tmp_path}"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a run directory of this launcher" in err[0]
