"""An episode on the wire: one `Trajectory` message per sample, token arrays packed."""

from __future__ import annotations

from actors.types import EpisodeResult
from broker.codec import pack_tokens
from broker.wire import PromptTask, Trajectory


def trajectory_id(task_id: str, sample_index: int) -> str:
    """Deterministic, so a group re-generated after a replica died is deduplicated by
    Nats-Msg-Id against the samples the dead replica had already published."""
    return f"{task_id}/{sample_index}"


_FROM_TASK = ("group_size", "step", "max_staleness", "env_class", "data_source", "is_eval")
"""The prompt task's fields that every trajectory of its group carries as they are."""
_FROM_RESULT = (
    "prompt_len",
    "reward",
    "stop_reason",
    "num_turns",
    "num_tool_calls",
    "resumed_turns",
    "resumed_tokens",
    "segment_starts",
)
"""The episode result's fields that its trajectory carries as they are."""


def to_trajectory(
    result: EpisodeResult, *, task: PromptTask, sample_index: int, actor_id: str = ""
) -> Trajectory:
    return Trajectory(
        trajectory_id=trajectory_id(task.task_id, sample_index),
        group_id=task.task_id,
        sample_index=sample_index,
        actor_id=actor_id,
        **{name: getattr(task, name) for name in _FROM_TASK},
        **{name: getattr(result, name) for name in _FROM_RESULT},
        env_metrics=dict(result.env_metrics),
        timing=dict(result.timing),
        **pack_tokens(
            token_ids=result.token_ids,
            logprobs=result.logprobs,
            loss_mask=result.loss_mask,
            versions=result.versions,
        ),
    )
