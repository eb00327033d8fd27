"""Reference computations that tests and benchmarks hold the engines to: the slow, obvious
way, so that nothing clever can be wrong in the same way on both sides."""

from __future__ import annotations

import torch


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, prompt: list[int], max_tokens: int, eos_id: int) -> list[int]:
    """Greedy decoding with a full forward pass per token (no KV cache): the token ids after
    `prompt`, up to `max_tokens`, ending at `eos_id` included (-1: never)."""
    ids, out = list(prompt), []
    for _ in range(max_tokens):
        token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        out.append(token)
        ids.append(token)
        if token == eos_id:
            break
    return out
