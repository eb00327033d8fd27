"""`python -m deploy.local --resume`: which run it names and what refuses it, without
starting anything (the resume itself: tests/faults/test_resume_run.py)."""

from __future__ import annotations

import hashlib
import json

import pytest

from common.config import read_sections
from deploy import local
from deploy.frozen_config import freeze, frozen_path


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


def test_a_resume_starts_from_the_frozen_config_with_its_overrides_on_top(tmp_path, capsys):
    """The user's file is gone (or edited); the run's own config.yaml is what resumes."""
    launched = {"config": str(tmp_path / "deleted.toml"), "overrides": ["learner.total_steps=3"]}
    run_dir = _run(tmp_path, "20261126-090000", launched)
    sections = {"local": {"runs_dir": str(tmp_path), "actor_replicas": 1}, "learner": {}}
    digest = freeze(run_dir, sections)
    assert digest == hashlib.sha256(frozen_path(run_dir).read_bytes()).hexdigest()
    assert read_sections(frozen_path(run_dir)) == sections
    (tmp_path / "latest").symlink_to(run_dir.name)
    finder = tmp_path / "finder.toml"  # --resume's --config: only where the runs are
    finder.write_text(f'[local]\nruns_dir = "{tmp_path}"\nactor_replicas = 5\n')
    plan = local._plan(finder, ["local.actor_replicas=2"], "latest")
    assert plan == (run_dir, frozen_path(run_dir), ["local.actor_replicas=2"], plan[3], None)
    assert plan[3].actor_replicas == 2
    assert "resuming with overrides on its frozen config: local.actor_replicas=2" in (
        capsys.readouterr().out
    )


def test_a_run_from_before_frozen_configs_resumes_from_its_first_launch(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'[local]\nruns_dir = "{tmp_path}"\n')
    run_dir = _run(
        tmp_path, "20261126-100000", {"config": str(config), "overrides": ["learner.total_steps=3"]}
    )
    plan = local._plan(config, ["local.actor_replicas=3"], str(run_dir))
    assert plan[1:3] == (config, ["learner.total_steps=3", "local.actor_replicas=3"])
