"""Keyword-only builders of wire messages for tests."""

from __future__ import annotations

import numpy as np

from broker.codec import pack_tokens
from broker.wire import PromptTask, Trajectory


def trajectory(
    *,
    trajectory_id: str = "traj-0",
    group_id: str = "group-0",
    group_size: int = 4,
    sample_index: int = 0,
    step: int = 0,
    num_tokens: int = 64,
    prompt_len: int = 16,
    version: int = 0,
    reward: float = 1.0,
    seed: int = 0,
) -> Trajectory:
    rng = np.random.default_rng(seed)
    loss_mask = np.zeros(num_tokens, dtype=np.uint8)
    loss_mask[prompt_len:] = 1
    return Trajectory(
        trajectory_id=trajectory_id,
        group_id=group_id,
        group_size=group_size,
        sample_index=sample_index,
        step=step,
        env_class="calculator",
        prompt_len=prompt_len,
        reward=reward,
        stop_reason="stop",
        num_turns=2,
        env_metrics={"num_tool_calls": 1.0},
        timing={"generate_s": 0.5},
        **pack_tokens(
            token_ids=rng.integers(0, 150_000, num_tokens),
            logprobs=-rng.random(num_tokens) * loss_mask,
            loss_mask=loss_mask,
            versions=np.where(loss_mask == 1, version, -1),
        ),
    )


def prompt_task(*, task_id: str = "task-0", step: int = 0, group_size: int = 4) -> PromptTask:
    return PromptTask(
        task_id=task_id,
        step=step,
        group_size=group_size,
        env_class="calculator",
        data_source="calculator",
        prompt=[{"role": "user", "content": "What is 2 + 3?"}],
        reward_spec={"ground_truth": "5"},
    )
