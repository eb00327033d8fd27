"""vLLM fixtures for actor tests: the tiny random model (and a transformers copy of it as the
reference), and ONE real engine per session (~30-60 s to start on a shared 2-core CPU),
shut down at teardown so no engine process outlives the tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from demo.tinymodel import build_random_tiny_model

    return build_random_tiny_model()  # cached under .cache/tinymodel: seconds the first time


@pytest.fixture(scope="session")
def hf_tiny_model(tiny_model_dir):
    """transformers' Qwen2 on the same weights (fp32, eval): the reference implementation."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
async def vllm_engine(tiny_model_dir):
    from actors.vllm_engine import VllmEngine, VllmEngineConfig
    from demo.engine import tiny_engine_settings

    engine = await VllmEngine.start(
        VllmEngineConfig(**tiny_engine_settings(tiny_model_dir), track_weights_checksum=True)
    )
    yield engine
    engine.shutdown()


USER_MESSAGES = ["What is 17 + 25?", "What is 3 * 4?", "Hello"]


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def prompts(tokenizer) -> list[list[int]]:
    """The chat-templated token ids of `USER_MESSAGES`."""
    out = []
    for text in USER_MESSAGES:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        out.append(tokenizer.encode(rendered, add_special_tokens=False))
    return out
