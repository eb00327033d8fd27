"""Fixtures for actor tests: a transformers copy of the tiny random model (the reference for
the session engine of tests/conftest.py), its tokenizer and chat-templated prompts."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def hf_tiny_model(tiny_model_dir):
    """transformers' Qwen2 on the same weights (fp32, eval): the reference implementation."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


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
