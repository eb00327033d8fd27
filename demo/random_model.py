"""Random-weight Qwen2 models with the demo's tokenizer, of any shape: weights that measure
memory and speed, not quality.

No model can be downloaded here (demo/tinymodel.py), so a measurement at a real model's
shape builds one of that shape: the benchmarks (the weight broadcast, the update stall, the
scale ladder, the learner on a GPU, bf16 deltas) and the test that holds an engine's host
memory during a weight update to its bound (tests/actors/test_engine_update_memory.py,
through deploy/engine_memory.py) build them here, so a test and a benchmark that name one
shape measure one model. A shape is a `Shape`; `LADDER` is bench/scale.py's sizes and
`SHAPES` the ones known by name (Qwen2-0.5B's is both). Each is built once (seed 0) and
reused.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")  # fmt: skip
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "bench"
"""Where `build_model` keeps the models of `SHAPES`."""


@dataclass(frozen=True)
class Shape:
    """A Qwen2 shape (head_dim = hidden / heads: vLLM's CPU attention needs >= 32)."""

    name: str
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int = 151_936  # Qwen2's embedding rows (more than its tokenizer's entries)

    def config(self, **extra):
        """The transformers config of this shape (tied embeddings), plus `extra` fields."""
        from transformers import Qwen2Config

        return Qwen2Config(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            tie_word_embeddings=True,
            **extra,
        )

    def build(self, tokenizer_dir: Path, cache_root: Path) -> Path:
        """A random model of this shape with the tokenizer in `tokenizer_dir`, built once
        into `cache_root/<name>-<hidden>x<layers>`."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        config = self.config(max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, bos_token_id=None)  # fmt: skip
        out = cache_root / f"{self.name}-{self.hidden}x{self.layers}"
        return random_qwen2(out, config, tokenizer_dir)

    @property
    def num_params(self) -> int:
        """Parameters with tied embeddings (what `model.parameters()` counts)."""
        head_dim = self.hidden // self.heads
        attention = self.hidden * head_dim * (self.heads * 2 + self.kv_heads * 2)
        attention += head_dim * (self.heads + 2 * self.kv_heads)  # q, k, v biases
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attention + mlp + 2 * self.hidden
        return self.vocab * self.hidden + self.layers * per_layer + self.hidden


LADDER = (
    Shape("10M", hidden=64, layers=2, intermediate=256, heads=2, kv_heads=1),
    Shape("45M", hidden=256, layers=4, intermediate=1024, heads=4, kv_heads=2),
    Shape("120M", hidden=512, layers=8, intermediate=2048, heads=8, kv_heads=2),
    Shape("0.5B", hidden=896, layers=24, intermediate=4864, heads=14, kv_heads=2),
)
"""bench/scale.py's sizes, from embedding-dominated to Qwen2-0.5B's shape (494M parameters,
1.98 GB in fp32)."""

SHAPES = {
    "qwen2-0.5b-shape": LADDER[-1],
    # Its vocabulary a multiple of 64, as real models' are: vLLM pads another one, and then
    # processes the embedding only at the end of the load (its bucket stays alive till then).
    "qwen2-1024x4-vocab512": Shape(
        "1024x4-vocab512", hidden=1024, layers=4, intermediate=2816, heads=16, kv_heads=4,
        vocab=512,
    ),
}  # fmt: skip
"""Shapes by name (`build_model`'s cache directory): Qwen2-0.5B's (the ladder's last rung,
one object under two names) and a small one (174 MB of fp32)."""
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
    `cache/<shape>` (the name, not the `Shape`'s own: `Shape.build` keeps its models apart)."""
    return random_qwen2(cache / shape, SHAPES[shape].config(max_position_embeddings=4096))
