"""Continuing an episode from its last turn after its replica died: the episode's state as
a checkpoint, and the rules for taking one over. Pure, no I/O: actors/episode.py rebuilds
the env session (replaying the recorded actions) and actors/episode_checkpoints.py moves
checkpoints to and from the broker.

A checkpoint is continued only when every policy token in it may still be trained on and
belongs to the history the engine is on:

- `stale`: a token older than the task's `min_version`, which the learner would drop (the
  staleness rule, learner/staleness.py); a fresh start generates at a version it accepts.
- `ahead`: a token newer than the engine's weights. Either the learner was restarted from
  an older checkpoint (those tokens come from a history that was rolled back) or this
  engine is behind; either way the tokens are not this policy's, and the episode starts over.

After those, the env must agree: `prompt` (the re-opened session's prompt templates to other
tokens) and `replay` / `env` (the recorded actions did not give back the recorded
observations, or the env server failed during the replay). Each refusal is counted.
"""

from __future__ import annotations

import time

import numpy as np

from actors.types import NO_POLICY_VERSION, EpisodeResult
from broker.codec import pack_tokens, token_arrays
from broker.wire import EpisodeCheckpoint, PromptTask

REFUSALS = ("stale", "ahead", "prompt", "replay", "env")


def checkpoint_of(
    task: PromptTask,
    sample_index: int,
    result: EpisodeResult,
    actions: list[str],
    observations: list[list[dict]],
    *,
    actor_id: str = "",
) -> EpisodeCheckpoint:
    """The episode's state between two turns (after an observation's delta)."""
    return EpisodeCheckpoint(
        task_id=task.task_id,
        sample_index=sample_index,
        actor_id=actor_id,
        num_turns=result.num_turns,
        prompt_len=result.prompt_len,
        reward=result.reward,
        actions=list(actions),
        observations=[list(o) for o in observations],
        env_metrics=dict(result.env_metrics),
        turn_finish_reasons=list(result.turn_finish_reasons),
        num_env_retries=result.num_env_retries,
        timing=dict(result.timing),
        recorded_at=time.time(),
        **pack_tokens(
            token_ids=result.token_ids,
            logprobs=result.logprobs,
            loss_mask=result.loss_mask,
            versions=result.versions,
        ),
    )


def resume_refusal(checkpoint: EpisodeCheckpoint, task: PromptTask, engine_version: int):
    """Why the checkpoint's tokens may not be continued on this engine (None: they may)."""
    versions = token_arrays(checkpoint).versions
    produced = versions[versions != NO_POLICY_VERSION]
    if produced.size and int(produced.min()) < task.min_version:
        return "stale"
    if produced.size and int(produced.max()) > engine_version:
        return "ahead"
    return None


def prompt_matches(checkpoint: EpisodeCheckpoint, prompt_ids: list[int]) -> bool:
    """Does the re-opened session's templated prompt begin the recorded tokens?"""
    recorded = token_arrays(checkpoint).token_ids[: checkpoint.prompt_len]
    return checkpoint.prompt_len == len(prompt_ids) and np.array_equal(recorded, prompt_ids)


def restore(result: EpisodeResult, checkpoint: EpisodeCheckpoint) -> None:
    """Put the checkpoint's tokens, rewards and counts into a fresh `result`, and count
    what was taken over (`resumed_turns`, `resumed_tokens`)."""
    arrays = token_arrays(checkpoint)
    result.token_ids = arrays.token_ids.tolist()
    result.logprobs = arrays.logprobs.tolist()
    result.loss_mask = arrays.loss_mask.tolist()
    result.versions = arrays.versions.tolist()
    result.prompt_len = checkpoint.prompt_len
    result.reward = checkpoint.reward
    result.num_turns = checkpoint.num_turns
    result.env_metrics = dict(checkpoint.env_metrics)
    result.num_tool_calls = int(result.env_metrics.get("num_tool_calls", 0))
    result.turn_finish_reasons = list(checkpoint.turn_finish_reasons)
    result.num_env_retries += checkpoint.num_env_retries
    for name in ("generate_s", "env_s"):  # the replay's env time is added to the recorded
        result.timing[name] = result.timing.get(name, 0.0) + checkpoint.timing.get(name, 0.0)
    result.timing["start"] = checkpoint.timing.get("start", result.timing.get("start", 0.0))
    result.timing["resumed_at"] = time.time()
    result.resumed_turns = checkpoint.num_turns
    result.resumed_tokens = int(np.count_nonzero(arrays.versions != NO_POLICY_VERSION))
