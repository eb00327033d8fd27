"""Builders shared by the learner tests: a tiny random Qwen2, trajectories, samples, configs."""

from __future__ import annotations

import numpy as np
import torch

from broker.codec import pack_tokens
from broker.wire import Trajectory
from learner.trainer.config import TrainerConfig
from learner.trainer.sample import Sample

VOCAB = 300


def tiny_qwen2(*, seed: int = 0, tie_word_embeddings: bool = False) -> torch.nn.Module:
    """Random Qwen2ForCausalLM: hidden 64, 2 layers, 2 heads of 32, vocab 300 (~120K params)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).to(torch.float32)


def trajectory(
    *,
    trajectory_id: str,
    group_id: str = "g0",
    group_size: int = 2,
    sample_index: int = 0,
    step: int = 0,
    max_staleness: int = -1,
    reward: float = 0.0,
    token_ids: list[int] = (1, 2, 3, 4),
    loss_mask: list[int] | None = None,
    logprobs: list[float] | None = None,
    versions: list[int] | None = None,
    prompt_len: int = 2,
    env_class: str = "calculator",
    segment_starts: list[int] = (),
) -> Trajectory:
    n = len(token_ids)
    loss_mask = loss_mask if loss_mask is not None else [0] * prompt_len + [1] * (n - prompt_len)
    logprobs = logprobs if logprobs is not None else [-1.0 if m else 0.0 for m in loss_mask]
    versions = versions if versions is not None else [0 if m else -1 for m in loss_mask]
    return Trajectory(
        trajectory_id=trajectory_id,
        group_id=group_id,
        group_size=group_size,
        sample_index=sample_index,
        step=step,
        max_staleness=max_staleness,
        env_class=env_class,
        prompt_len=prompt_len,
        reward=reward,
        stop_reason="stop",
        num_turns=1,
        segment_starts=list(segment_starts),
        **pack_tokens(
            token_ids=token_ids, logprobs=logprobs, loss_mask=loss_mask, versions=versions
        ),
    )


def random_samples(
    *,
    num_samples: int = 0,
    lengths: list[int] | None = None,
    seed: int = 0,
    min_len: int = 6,
    max_len: int = 40,
    version: int = 0,
) -> list[Sample]:
    """Random sequences (of the given `lengths`, or `num_samples` random lengths): a prompt
    of 3-5 tokens then generated tokens, behaviour logprobs near the random model's typical
    value, advantages of both signs."""
    rng = np.random.default_rng(seed)
    if lengths is None:
        lengths = [int(rng.integers(min_len, max_len + 1)) for _ in range(num_samples)]
    samples = []
    for i, n in enumerate(lengths):
        prompt_len = min(int(rng.integers(3, 6)), n - 1)
        mask = np.array([0] * prompt_len + [1] * (n - prompt_len), dtype=np.uint8)
        samples.append(
            Sample(
                token_ids=rng.integers(0, VOCAB, n).astype(np.int32),
                loss_mask=mask,
                behaviour_logprobs=np.where(
                    mask == 1, -np.log(VOCAB) + rng.normal(0, 0.05, n), 0.0
                ).astype(np.float32),
                versions=np.where(mask == 1, version, -1).astype(np.int32),
                advantage=float(rng.normal()),
                trajectory_id=f"t{i}",
                group_id=f"g{i // 2}",
                env_class="calculator",
            )
        )
    return samples


def learner_config(**overrides) -> TrainerConfig:
    """A trainer config for the tiny model; `algorithm`/`optim` entries may be dicts. The
    trainer's own config, not `LearnerConfig`: every trainer test so shows that the trainer
    needs nothing of the bus side's settings."""
    base = {
        "model_path": "unused-in-tests",
        "micro_batch_tokens": 64,
        "optim": {"lr": 1e-3, "grad_clip": 1.0, "weight_decay": 0.01},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return TrainerConfig.model_validate(base)
