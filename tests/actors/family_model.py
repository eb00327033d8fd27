"""A tiny model over Qwen's real 151k-token vocabulary that plays one tool-use episode in
each model family's chat format (demo/family_templates.py), for tests of the whole actor
path per format.

A random-init Qwen2 (the tiny recipe's shape, head_dim 32) whose vocabulary holds Qwen's
BPE and every family's added tokens is taught, by about a minute of supervised steps, one
conversation per family: the prompt, the family's tool call, the tool's answer, the final
answer. The training sequences are built exactly as the actor builds an episode
(actors/chat.py: the prompt templated once, each assistant turn as generated tokens closed
by the family's EOS, each observation as a templated delta), so greedy decoding on vLLM
replays them through the real actor, env server and broker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from demo.family_templates import Family, family_tokenizer
from demo.tinymodel import DEFAULT_RECIPE, qwen2_config

EXTRA_IDS = 64
LEARNING_RATE = 5e-3
MARGIN = 3.0
CHECK_EVERY = 10
"""Room after Qwen's vocabulary for the families' added tokens (each adds at most ten)."""


def episode_example(
    chat, prompt: list[dict], tools: list[dict], turns: list[str], observations: list[list[dict]]
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of an episode as the actor builds it: `turns[k]` generated
    (closed by EOS, mask 1), then `observations[k]` as a delta (mask 0)."""
    ids = chat.prompt_ids(prompt, tools)
    mask = [0] * len(ids)
    for k, text in enumerate(turns):
        generated = chat.tokenizer.encode(text, add_special_tokens=False) + [chat.eos_token_id]
        ids, mask = ids + generated, mask + [1] * len(generated)
        if k < len(observations):
            delta = chat.observation_ids(observations[k])
            ids, mask = ids + delta, mask + [0] * len(delta)
    return ids, mask


def build_family_model(
    qwen_tokenizer: Any,
    families: list[Family],
    out_dir: str | Path,
    *,
    prompt: list[dict],
    tools: list[dict],
    answer: str,
    tool_result: str,
    max_steps: int = 400,
    seed: int = 0,
) -> Path:
    """Build, teach and save the model (with the first family's tokenizer, which vLLM loads
    for its own detokenizing; the actor templates with each family's). Returns `out_dir`."""
    import torch
    from transformers import Qwen2ForCausalLM

    from actors.chat import ChatTemplate

    examples = []
    for family in families:
        chat = ChatTemplate(family_tokenizer(qwen_tokenizer, family))
        observation = [[{"role": "tool", "content": tool_result}]]
        turns = [family.sample_call, answer]
        examples.append(episode_example(chat, prompt, tools, turns, observation))
    vocab = len(qwen_tokenizer) + EXTRA_IDS
    assert all(max(ids) < vocab for ids, _ in examples), "a family added more tokens than fit"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        config = qwen2_config(DEFAULT_RECIPE, vocab_size=vocab, eos_id=0, pad_id=0)
        model = Qwen2ForCausalLM(config)
        _teach(model, examples, max_steps)
    out = Path(out_dir)
    model.save_pretrained(out)
    family_tokenizer(qwen_tokenizer, families[0]).save_pretrained(out, save_jinja_files=False)
    return out


def _teach(model, examples: list[tuple[list[int], list[int]]], max_steps: int) -> None:
    """Supervised steps on the loss-mask-1 tokens until every one of them is the model's
    greedy choice by MARGIN nats (checked every CHECK_EVERY steps; RuntimeError if not by
    `max_steps`): tests decode greedily, and a margin that large is not flipped by another
    CPU's rounding (seeds 0 and 1 took 100 steps to 4.3-7.2 nats; seed 2 needed more). The
    head is applied to those positions only: over a 151k vocabulary, logits at every
    position cost ~100x more (demo/sft.py's full-sequence loss took 6.5 s a step here)."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    ids = torch.zeros((len(examples), width), dtype=torch.long)  # [B, T], right-padded
    attention = torch.zeros_like(ids)
    targets = torch.zeros_like(ids, dtype=torch.bool)  # [B, T]: position t predicts t + 1
    for row, (tokens, mask) in enumerate(examples):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        attention[row, : len(tokens)] = 1
        targets[row, : len(tokens) - 1] = torch.tensor(mask[1:]) == 1
    labels = ids[:, 1:][targets[:, :-1]]  # [N]
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    model.train()
    for step in range(max_steps):
        for group in optimizer.param_groups:
            group["lr"] = LEARNING_RATE * min(1.0, (step + 1) / 5)
        hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state
        logits = model.lm_head(hidden[targets])  # [N, V] at the taught positions only
        if step % CHECK_EVERY == 0 and _margin(logits.detach(), labels) >= MARGIN:
            model.eval()
            return
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    raise RuntimeError(f"the family model did not learn its episodes in {max_steps} steps")


def _margin(logits, labels) -> float:
    """The smallest lead of a taught token's logit over the best other token's."""
    import torch

    taught = logits.gather(1, labels[:, None])[:, 0]  # [N]
    others = logits.scatter(1, labels[:, None], float("-inf")).max(dim=1).values  # [N]
    return float(torch.min(taught - others))
