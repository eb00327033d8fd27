"""GPU tests (`make gpu-check`, docs/gpu.md): every test here is marked `gpu` and skips
without CUDA, or without as many GPUs as it needs; `make test` on a CPU machine collects and
skips them. Under `make gpu-check` (TETHER_GPU_REQUIRED=1) a skip is a failure instead: a
GPU machine must run them all (the 2-GPU tests excepted on a 1-GPU machine).

Figures each test measures are added to `runs/gpu-check/results.json` (a flat object), which
docs/gpu.md quotes; TETHER_GPU_RESULTS names another file (the GPU kit writes straight into
what the device tool brings back, so a run cut short keeps what it measured)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(os.environ.get("TETHER_GPU_RESULTS") or REPO / "runs" / "gpu-check" / "results.json")


NEAR_TIE = 0.1
"""Logit gap (bf16 compute) under which transformers' own top two count as tied."""


PROMPTS = ["What is 17 + 25?", "What is 3 * 4?", "Hello"]


def num_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def need_gpus(count: int) -> None:
    """Skip (or, under make gpu-check, fail when not even one GPU is there) unless the
    machine has `count` GPUs."""
    have = num_gpus()
    if have >= count:
        return
    if os.environ.get("TETHER_GPU_REQUIRED") == "1" and have == 0:
        pytest.fail("make gpu-check: no CUDA GPU visible")
    pytest.skip(f"needs {count} CUDA GPU(s), found {have}")


def need_vllm() -> None:
    """Skip (fail under make gpu-check, whose `make install` puts it there) unless vLLM's
    CUDA build is importable: a GPU machine may hold torch but no vLLM."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("TETHER_GPU_REQUIRED") == "1":
        pytest.fail("make gpu-check: vLLM is not installed (make install)")
    pytest.skip("needs vLLM (the `vllm` extra), not installed")


def record(**figures: float | str) -> None:
    """Add figures to the results file (runs/gpu-check/results.json; read by docs/gpu.md)."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results.update(figures)
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print("\n" + "  ".join(f"{k}={v}" for k, v in figures.items()))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from demo.tinymodel import build_random_tiny_model

    return build_random_tiny_model()


@pytest.fixture(scope="module")
def prompts(tiny_model_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for text in PROMPTS
    ]


def greedy_agreement(model, prompt: list[int], tokens: list[int]) -> tuple[int, int]:
    """(tokens equal to transformers' argmax, tokens that differ only at a near-tie); raises
    on a token transformers does not come close to choosing."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]  # [T, V]
    exact = near = 0
    for position, token in enumerate(tokens):
        best = int(logits[position].argmax())
        if best == token:
            exact += 1
            continue
        gap = float(logits[position, best] - logits[position, token])
        assert gap < NEAR_TIE, (
            f"token {position}: vLLM chose {token}, transformers {best} by {gap:.3f}"
        )
        near += 1
        break  # after a tie the continuations legitimately differ
    return exact, near


async def start_bf16_engine(tiny_model_dir, **settings):
    """A CUDA engine on the tiny model at 0.3 of the GPU, in bf16 (`auto` on GPU)."""
    need_gpus(1)
    need_vllm()
    from actors.config import VllmEngineConfig
    from actors.vllm_engine import VllmEngine

    engine = await VllmEngine.start(
        VllmEngineConfig(model=str(tiny_model_dir), max_model_len=1024, max_num_seqs=8,
                         gpu_memory_utilization=0.3, **settings)
    )  # fmt: skip
    assert engine.dtype == "bfloat16"
    return engine


async def greedy_against(engine, model, prompts, version: int) -> tuple[int, int]:
    """(tokens equal to transformers' argmax, tokens generated) of greedy output on `prompts`,
    every token of `version`; a difference anywhere but at a near-tie raises."""
    from actors.config import SamplingConfig
    from actors.types import Turn

    exact = total = 0
    for prompt in prompts:
        out = await engine.generate(prompt, Turn(SamplingConfig(temperature=0.0), max_tokens=24))
        assert out.versions == [version] * len(out.token_ids)
        exact += greedy_agreement(model, prompt, out.token_ids)[0]
        total += len(out.token_ids)
    return exact, total


async def sampled_logprob_gap(engine, model, prompts, *, seed: int):
    """|vLLM logprob - transformers' recomputation| of every token sampled at T = 1.0."""
    import torch

    from actors.config import SamplingConfig
    from actors.types import Turn

    gaps = []
    for i, prompt in enumerate(prompts):
        out = await engine.generate(
            prompt, Turn(SamplingConfig(temperature=1.0), max_tokens=48, seed=seed + i)
        )
        with torch.no_grad():
            ids = torch.tensor([prompt + out.token_ids])
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
            reference = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
        gaps.append((torch.tensor(out.logprobs) - reference).abs())
    return torch.cat(gaps)
