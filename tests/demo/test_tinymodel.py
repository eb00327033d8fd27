"""The tiny model: the shipped artifact, the builder (cache, CLI, a rebuild's quality band),
vLLM parity."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from actors.config import SamplingConfig
from actors.types import Turn
from demo.chat_template import CHAT_TEMPLATE
from demo.data import DEMO_TOOLS, eval_rows
from demo.reference import hf_greedy
from demo.tinymodel import (
    BUILD_INFO,
    DEFAULT_RECIPE,
    TinyModelRecipe,
    build_random_tiny_model,
    build_tiny_model,
    recipe_hash,
    shipped_model_dir,
)
from tests.demo.warm_start import measure

REPO = Path(__file__).resolve().parents[2]
FAST = TinyModelRecipe(tokenizer_conversations=100, sft_steps=2, mix_steps=2, sft_batch_size=2)


def test_architecture(tiny_model_dir):
    config = AutoConfig.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert config.model_type == "qwen2"
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (4, 128, 384)
    assert config.num_attention_heads == config.num_key_value_heads == 4
    assert config.hidden_size // config.num_attention_heads == 32  # vLLM CPU needs >= 32
    assert config.tie_word_embeddings and config.vocab_size == len(tokenizer)
    assert (config.eos_token_id, config.pad_token_id) == (2, 0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    num_params = sum(p.numel() for p in model.parameters())
    assert 0.8e6 < num_params < 1.0e6
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert GenerationConfig.from_pretrained(tiny_model_dir).eos_token_id == 2
    info = json.loads((tiny_model_dir / BUILD_INFO).read_text())
    assert (
        info["num_params"] == num_params
        and info["recipe"]["sft_steps"] == 0 == info["recipe"]["mix_steps"]
    )


def test_recipe_rejects_small_head_dim():
    with pytest.raises(ValueError, match="head_dim"):
        TinyModelRecipe(hidden_size=128, num_heads=8)
    with pytest.raises(ValueError):
        TinyModelRecipe(unknown_field=1)


def test_cache_hit_does_not_rebuild(tmp_path):
    # A build killed outright left its scratch directory: the next build sweeps it.
    killed = tmp_path / f".tiny-qwen2-{recipe_hash(FAST, DEMO_TOOLS)}-killed"
    (killed / "partial").mkdir(parents=True)
    steps = []
    path = build_tiny_model(
        tmp_path, tools=DEMO_TOOLS, recipe=FAST, log=lambda step, loss, n: steps.append(step)
    )
    assert steps == [0, 1, 2, 3] and path.name == f"tiny-qwen2-{recipe_hash(FAST, DEMO_TOOLS)}"
    weights = path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    again = build_tiny_model(
        tmp_path, tools=DEMO_TOOLS, recipe=FAST, log=lambda *a: steps.append("rebuilt")
    )
    assert again == path and steps == [0, 1, 2, 3] and weights.stat().st_mtime_ns == stamp
    other = build_tiny_model(
        tmp_path, tools=DEMO_TOOLS, recipe=FAST.model_copy(update={"seed": 1}), log=None
    )
    assert other != path
    # Only finished entries (and their lock files) remain: no half-built temp directories.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == sorted(
        [path.name, other.name]
    )


def test_random_model_plays_episodes(tiny_model_dir):
    stats = measure(tiny_model_dir, eval_rows(3), samples=2)
    assert stats.num_episodes == 6 and stats.pass_at_1 == 0.0


def test_shipped_model_is_the_recipe_with_its_tokenizer_and_tools():
    directory = shipped_model_dir()
    info = json.loads((directory / BUILD_INFO).read_text())
    assert info["recipe"] == DEFAULT_RECIPE.model_dump()
    assert info["artifact_version"] >= 1
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.chat_template == CHAT_TEMPLATE  # the one template, not a stale copy
    assert json.loads((directory / "tools.json").read_text()) == DEMO_TOOLS
    model = AutoModelForCausalLM.from_pretrained(directory)
    assert sum(p.numel() for p in model.parameters()) == info["num_params"]


def test_cli_prints_the_model_directory(tmp_path):
    out = (
        subprocess.run(
            [sys.executable, "-m", "demo.tinymodel", "--out", str(tmp_path), "--no-warmstart"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    assert Path(out).parent == tmp_path and (Path(out) / BUILD_INFO).is_file()
    assert Path(out).name == build_random_tiny_model(tmp_path).name  # same entry, cache hit


@pytest.mark.vllm
async def test_vllm_greedy_equals_transformers_greedy(vllm_engine, tiny_model_dir):
    """The model directory as built loads into vLLM (the session's engine, given the
    directory's own files again: earlier tests may have pushed other weights into it) and
    decodes the demo's templated prompts as transformers does."""
    await vllm_engine.load_snapshot(tiny_model_dir, 0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                row["prompt"], tools=DEMO_TOOLS, add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for row in eval_rows(3)
    ]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for prompt in prompts:
        generation = await vllm_engine.generate(prompt, Turn(SamplingConfig(temperature=0.0), 24))
        assert generation.token_ids == hf_greedy(model, prompt, 24, tokenizer.eos_token_id)


# The band a warm start must land in: RL needs a model that calls the tool on some questions
# and guesses on others, and that copies operands and results when it calls. Measured with
# `measure` (100 eval questions x 2 samples) on builds of the default recipe (seed 0 at 1
# and 2 threads: 0.37 / 0.385 / 0.96; seeds 1-3: docs/tinymodel.md). For the shipped model
# only sampling varies (binomial sd 0.034 at 0.37: the band is > 6 sd wide each side); for a
# rebuild it admits every measured build that learned to copy (the weakest: seed 0 on a
# 2-core "Intel Xeon Processor" machine, 0.27 / 0.48 / 0.56; seed 3: 0.325 / 0.505 / 0.64)
# and refuses the two seeds that never did (arguments right in 0-3% of calls): the threshold
# sits in that gap, 10x above the one and nearly 2x below the other.
BAND_PASS_AT_1 = (0.15, 0.75)
BAND_CALL_RATE = (0.15, 0.85)
MIN_CALLED_RIGHT = 0.3


def _assert_in_band(stats) -> None:
    assert BAND_PASS_AT_1[0] < stats.pass_at_1 < BAND_PASS_AT_1[1], stats
    assert BAND_CALL_RATE[0] < stats.call_rate < BAND_CALL_RATE[1], stats  # the decision RL learns
    assert stats.called_right > MIN_CALLED_RIGHT, stats  # a call is mostly a right answer


def test_shipped_model_lands_between_never_and_always_right():
    """What `make run` starts RL from. Measured here: see docs/tinymodel.md."""
    _assert_in_band(measure(shipped_model_dir(), eval_rows(100), samples=2))


@pytest.mark.slow
@pytest.mark.timeout(3000)  # a build is minutes; a seed passed over costs another
def test_a_rebuild_still_lands_in_the_band(tmp_path):
    """`python -m demo.tinymodel --rebuild`: the tool specs from a live env server, the
    default recipe, minutes of training on this machine's floats; not bit-equal to the
    shipped model, but as useful a start for RL."""
    # In a process of its own, as a user runs it: a build inside this test process came out
    # differently (it did not learn to copy) after the earlier tests' global torch state.
    built = subprocess.run(
        [sys.executable, "-m", "demo.tinymodel", "--rebuild", "--out", str(tmp_path)],
        capture_output=True, text=True, check=True, timeout=3000,
    )  # fmt: skip
    directory = Path(built.stdout.strip().splitlines()[-1])
    assert json.loads((directory / "tools.json").read_text()) == DEMO_TOOLS
    _assert_in_band(measure(directory, eval_rows(100), samples=2))
