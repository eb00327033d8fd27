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
