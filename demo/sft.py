"""Supervised warm start: next-token loss on assistant tokens only.

A conversation is tokenised the way the rollout actor builds it (token in, token out):
the templated prompt, then each assistant turn's tokens up to and including `<|im_end|>`
(loss mask 1), then each observation as a templated delta (loss mask 0). Segments are
tokenised separately and concatenated, so training sees exactly the token sequences RL
will see.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import torch

from demo.chat_template import IM_END, render_chat

IGNORE_INDEX = -100


def assistant_spans(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans [start, end) the model generates:
    each assistant turn's text plus its `<|im_end|>`."""
    text = render_chat(messages, tools=tools)
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(render_chat(messages[:k], tools=tools, add_generation_prompt=True))
        generated = render_chat(messages[: k + 1], tools=tools)[start:]
        end = start + generated.index(IM_END) + len(IM_END)
        spans.append((start, end))
    return text, spans


def encode_conversation(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 on generated tokens) of one conversation."""
    text, spans = assistant_spans(messages, tools)
    ids: list[int] = []
    mask: list[int] = []
    cursor = 0
    for start, end in spans + [(len(text), len(text))]:
        for segment, is_generated in ((text[cursor:start], 0), (text[start:end], 1)):
            if segment:
                segment_ids = tokenizer.encode(segment, add_special_tokens=False)
                ids += segment_ids
                mask += [is_generated] * len(segment_ids)
        cursor = end
    return ids, mask


def collate(
    examples: list[tuple[list[int], list[int]]], *, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input_ids, attention_mask and labels (IGNORE_INDEX off the loss mask)."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # [B, T]
    attention = torch.zeros((len(examples), width), dtype=torch.long)  # [B, T]
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)  # [B, T]
    for row, (ids, mask) in enumerate(examples):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.where(torch.tensor(mask) == 1, torch.tensor(ids), IGNORE_INDEX)
    return input_ids, attention, labels


def shared_prefix_length(examples: list[tuple[list[int], list[int]]]) -> int:
    """Length P of the token prefix all examples share, cut so that every loss token sits at
    index > P (its prediction comes from a position after the prefix)."""
    first = examples[0][0]
    length = min(len(ids) for ids, _ in examples)
    for ids, mask in examples:
        common = next((t for t in range(length) if ids[t] != first[t]), length)
        first_loss = next((t for t, m in enumerate(mask) if m), len(ids))
        length = min(length, common, max(0, first_loss - 1))
    return length


def masked_lm_loss(
    model: Any, examples: list[tuple[list[int], list[int]]], *, pad_id: int
) -> torch.Tensor:
    """Mean next-token loss over loss-mask tokens. The shared prefix (system prompt and tool
    specs, most of every demo) is run once and its KV cache repeated over the batch, with
    gradients flowing through it; the result equals a plain forward over the full batch."""
    prefix_length = shared_prefix_length(examples)
    suffixes = [(ids[prefix_length:], mask[prefix_length:]) for ids, mask in examples]
    input_ids, attention, labels = collate(suffixes, pad_id=pad_id)  # [B, S]
    cache = None
    if prefix_length > 0:
        prefix = torch.tensor([examples[0][0][:prefix_length]])  # [1, P]
        cache = model(input_ids=prefix, use_cache=True, logits_to_keep=1).past_key_values
        cache.batch_repeat_interleave(len(examples))
        attention = torch.cat(  # [B, P + S]
            [torch.ones((len(examples), prefix_length), dtype=attention.dtype), attention], dim=1
        )
    logits = model(  # [B, S, V]
        input_ids=input_ids, attention_mask=attention, past_key_values=cache, use_cache=False
    ).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX
    )


def lr_at(step: int, *, num_steps: int, peak_lr: float, warmup_steps: int) -> float:
    """Linear warmup to `peak_lr`, then cosine decay to 10% of it."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, num_steps - warmup_steps)
    return peak_lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def train_sft(
    model: torch.nn.Module,
    examples: list[tuple[list[int], list[int]]],
    *,
    pad_id: int,
    num_steps: int,
    batch_size: int,
    peak_lr: float,
    warmup_steps: int = 50,
    weight_decay: float = 0.0,
    seed: int = 0,
    log: Callable[[int, float], None] | None = None,
) -> list[float]:
    """AdamW on the masked next-token loss; batches drawn by a seeded shuffle. Returns the
    loss of every step."""
    if num_steps < 1 or batch_size < 1:
        raise ValueError(f"num_steps and batch_size must be >= 1: {num_steps}, {batch_size}")
    if len(examples) < batch_size:
        raise ValueError(f"need at least batch_size={batch_size} examples, got {len(examples)}")
    rng = random.Random(seed)
    order: list[int] = []
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=weight_decay
    )
    model.train()
    losses = []
    for step in range(num_steps):
        if len(order) < batch_size:
            order = list(range(len(examples)))
            rng.shuffle(order)
        batch = [examples[order.pop()] for _ in range(batch_size)]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(
                step, num_steps=num_steps, peak_lr=peak_lr, warmup_steps=warmup_steps
            )
        loss = masked_lm_loss(model, batch, pad_id=pad_id)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if log is not None:
            log(step, losses[-1])
    model.eval()
    return losses
