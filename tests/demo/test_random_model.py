"""demo/random_model.py's shapes, checked without building a model: each shape's parameter
count (what bench/scale.py divides by) against transformers' own model of its config, the
ladder's top rung at Qwen2-0.5B's count, and Qwen2-0.5B's shape as one object under both its
names (the ladder's and `build_model`'s)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from demo.random_model import LADDER, QWEN2_0_5B, SHAPES, SMALL


@pytest.mark.parametrize("shape", [*LADDER, SHAPES[SMALL]], ids=lambda s: s.name)
def test_each_shape_counts_the_parameters_transformers_builds(shape):
    with torch.device("meta"):
        model = Qwen2ForCausalLM(shape.config())  # the config Shape.build saves
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    assert shape.hidden // shape.heads >= 32  # vLLM's CPU attention


def test_the_ladder_ends_at_qwen2_0_5b():
    assert LADDER[-1].num_params == 494_032_768


def test_qwen2_0_5b_is_one_shape_under_both_names():
    assert SHAPES[QWEN2_0_5B] is LADDER[-1]
