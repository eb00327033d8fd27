"""Random-weight Qwen2 models with the demo's tokenizer, of any shape: weights that measure
memory and speed, not quality.

No model can be downloaded here (demo/tinymodel.py), so a measurement at a real model's
shape builds one of that shape: the benchmarks (the weight broadcast, the update stall, the
scale ladder, bf16 deltas) and the test that holds an engine's host memory during a weight
update to its bound (tests/actors/test_engine_update_memory.py, through
deploy/engine_memory.py) build them here, so a test and a benchmark that name one shape
measure one model. Each is built once (seed 0) and reused.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")  # fmt: skip
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "bench"
"""Where `build_model` keeps the models of `SHAPES`."""

SHAPES = {
    "qwen2-0.5b-shape": dict(
        hidden_size=896, num_hidden_layers=24, intermediate_size=4864, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936,
    ),
    # Its vocabulary a multiple of 64, as real models' are: vLLM pads another one, and then
    # processes the embedding only at the end of the load (its bucket stays alive till then).
    "qwen2-1024x4-vocab512": dict(
        hidden_size=1024, num_hidden_layers=4, intermediate_size=2816, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=512,
    ),
}  # fmt: skip
"""Qwen2 shapes (`Qwen2Config` fields; tied embeddings, fp32) by name."""
QWEN2_0_5B, SMALL = SHAPES


def random_qwen2(out: Path, config: Any, tokenizer_dir: Path | None = None) -> Path:
    """A random-init fp32 Qwen2 of `config` (a `Qwen2Config`; seed 0) with the tokenizer of
    `tokenizer_dir` (the demo's by default), saved once at `out`: built beside it and renamed
    into place, so an interrupted build leaves nothing to reuse. Random weights measure
    memory and speed, not quality."""
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import Qwen2ForCausalLM

    from demo.tinymodel import shipped_model_dir

    tokenizer_dir = tokenizer_dir or shipped_model_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.float32).save_pretrained(partial)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, partial / name)
    os.rename(partial, out)
    return out


def build_model(shape: str, cache: Path = CACHE) -> Path:
    """A random-init Qwen2 of `SHAPES[shape]` with the demo tokenizer, saved once under
    `cache`."""
    from transformers import Qwen2Config

    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=True)
    return random_qwen2(cache / shape, config)
