"""The README's promises, checked: exactly the two set-up commands, and its GPU config is a
valid config (a snippet that drifted from the real fields would mislead every new user)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from actors.config import VllmEngineConfig
from learner.config import LearnerConfig

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_the_readme_sets_up_with_exactly_make_run_and_make_test():
    commands = [line.split("#")[0].strip() for line in _blocks("(?:bash|sh|)")[0].splitlines()]
    assert [c for c in commands if c] == ["make run", "make test"]


def test_the_gpu_config_of_the_readme_is_valid():
    [snippet] = _blocks("toml")
    config = tomllib.loads(snippet)
    learner = LearnerConfig.model_validate(config["learner"])
    engine = VllmEngineConfig.model_validate(config["actor"]["engine"])
    assert learner.device == engine.device == "cuda"
    assert learner.dtype == engine.dtype == "bfloat16"
    assert learner.eval_interval is not None  # evals are off unless set
