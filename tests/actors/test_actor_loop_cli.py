"""The `actor` command line: its flags are public surface, and a bad config must be refused
before torch or vLLM is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from actors.cli import main, parse_args
from actors.config import ActorConfig
from common.config import load_section


def test_cli_flags_are_fixed():
    args = parse_args(["--config", "c.toml", "--replicas", "3", "actor.rollout.max_turns=4"])
    assert vars(args) == {
        "config": "c.toml",
        "replicas": 3,
        "overrides": ["actor.rollout.max_turns=4"],
    }
    assert parse_args(["--config", "c.toml"]).replicas == 1


def test_bad_config_is_refused_without_importing_torch_or_vllm(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[actor]\nrollout = { max_turns = 0 }\nengine = { model = "m" }\n')
    code = (
        "import sys; from actors.cli import main; rc = main(['--config', sys.argv[1]]); "
        "heavy = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]; "
        "print(rc, heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "2 []"
    assert "actor.rollout.max_turns" in out.stderr


def test_zero_replicas_is_refused(capsys):
    assert main(["--config", "c.toml", "--replicas", "0"]) == 2
    assert "--replicas must be >= 1" in capsys.readouterr().err


def test_limits_must_fit_the_engine(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[actor]\nrollout = { max_sequence_length = 4096 }\nengine = { model = "m" }\n')
    with pytest.raises(ValueError, match="exceeds engine.max_model_len"):
        load_section(ActorConfig, path, "actor")
    with pytest.raises(ValueError, match="host:port"):
        load_section(ActorConfig, path, "actor", ['actor.env.addresses=["nohost"]'])
