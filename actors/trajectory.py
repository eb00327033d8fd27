"""An episode on the wire: one `Trajectory` message per sample, token arrays packed."""

from __future__ import annotations

from actors.types import EpisodeResult
from broker.codec import pack_tokens
from broker.wire import PromptTask, Trajectory


def trajectory_id(task_id: str, sample_index: int) -> str:
    """Deterministic, so a group re-generated after a replica died is deduplicated by
    Nats-Msg-Id against the samples the dead replica had already published."""
    return f"{task_id}/{sample_index}"


def to_trajectory(
    result: EpisodeResult, *, task: PromptTask, sample_index: int, actor_id: str = ""
) -> Trajectory:
    return Trajectory(
        trajectory_id=trajectory_id(task.task_id, sample_index),
        group_id=task.task_id,
        group_size=task.group_size,
        sample_index=sample_index,
        step=task.step,
        env_class=task.env_class,
        data_source=task.data_source,
        actor_id=actor_id,
        is_eval=task.is_eval,
        prompt_len=result.prompt_len,
        reward=result.reward,
        stop_reason=result.stop_reason,
        num_turns=result.num_turns,
        num_tool_calls=result.num_tool_calls,
        env_metrics=dict(result.env_metrics),
        timing=dict(result.timing),
        **pack_tokens(
            token_ids=result.token_ids,
            logprobs=result.logprobs,
            loss_mask=result.loss_mask,
            versions=result.versions,
        ),
    )
