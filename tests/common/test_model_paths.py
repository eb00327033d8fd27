"""common/model_paths.py: which model settings are paths, and what is wrong with them."""

from __future__ import annotations

import pytest

from common.model_paths import looks_like_path, model_dir_problem


@pytest.mark.parametrize(
    "value, is_path",
    [
        ("/models/nope", True),
        ("./tiny", True),
        ("../tiny", True),
        ("~/models/tiny", True),
        ("runs/demo/model", True),  # two slashes: no hub id has them
        ("my models/tiny", True),  # a space: not a hub id
        ("Qwen/Qwen3-0.6B", False),
        ("gpt2", False),
        ("s3://bucket/models/tiny", False),
    ],
)
def test_what_looks_like_a_path(value, is_path):
    assert looks_like_path(value) is is_path


def test_a_model_directory_needs_config_json(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"")
    assert model_dir_problem(str(tmp_path / "model"), key="k") == (
        f"k: {tmp_path}/model holds no config.json: not a Hugging Face model directory"
    )
    (tmp_path / "model" / "config.json").write_text("{}")
    assert model_dir_problem(str(tmp_path / "model"), key="k") is None
    assert "is a file" in model_dir_problem(str(tmp_path / "weights.bin"), key="k")


def test_missing_paths_are_refused_hub_ids_are_left_to_the_loader():
    assert model_dir_problem("/models/nope", key="learner.model_path") == (
        "learner.model_path: /models/nope does not exist (a model directory; a hub id looks "
        "like org/name)"
    )
    assert model_dir_problem("Qwen/Qwen3-0.6B", key="k") is None
    assert "neither a directory here nor a hub id" in model_dir_problem("set me: DIR", key="k")
    assert model_dir_problem("", key="actor.engine.model") == (
        "actor.engine.model is empty: set it to a model directory (or a hub id)"
    )
