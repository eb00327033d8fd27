"""Workflow episodes: the user's agent loop runs on an env server (envservers/workflows.py)
and calls this replica's chat-completions endpoint (actors/agent_endpoint.py) under a key
naming the episode; the episode is what those calls recorded, token in / token out, and
its reward is what the agent returned.

    open the session (Reset: kind "workflow")     ─ as any episode (actors/episode.py)
    key = endpoint.open_episode(sampling, seed)
    RunWorkflow(session, base_url, key)           ─ the agent's calls land in `calls`
    endpoint.close_episode(key)                   ─ the key is refused from now on
    one segment → the episode's tokens, logprobs, versions, loss mask; reward

Stop reasons besides the stepped episode's: `error:workflow` (the agent's code raised, ran
past its time limit, returned no score, or never called the model), `error:workflow_env`
(the env server could not run it) and `error:agent_segments` (its calls formed several
conversations: a history the agent rewrote, or a second agent; each would be trained as its
own trajectory, which the learner's groups do not take yet, so the episode is refused,
said and counted, never merged into one sequence).

A workflow episode has no turn checkpoints: the agent's state lives in its own code, so a
redelivered task plays it again from the start.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from actors.config import SamplingConfig
from actors.env_retry import EnvFailed
from actors.types import EnvSession, EpisodeResult
from protos.client import EnvUnavailable

if TYPE_CHECKING:
    from actors.agent_endpoint import AgentEndpoint


async def play_workflow(
    session: EnvSession,
    endpoint: AgentEndpoint | None,
    sampling: SamplingConfig,
    seed: int | None,
    result: EpisodeResult,
) -> str:
    """Run a workflow session against `endpoint`, sampling as the rollout is configured;
    fills `result` and returns the stop reason. EnvFailed when there is nothing to train."""
    if endpoint is None:
        raise EnvFailed("error:workflow", "a workflow, and this rollout serves no agent endpoint")
    base_url = await endpoint.serving()
    key, calls = endpoint.open_episode(sampling, seed)
    start = time.perf_counter()
    try:
        outcome = await session.run_workflow(base_url, key)
    except EnvUnavailable as e:
        raise EnvFailed("error:workflow_env", str(e)) from e
    finally:
        endpoint.close_episode(key)
        result.timing["env_s"] += time.perf_counter() - start
    if outcome.error:
        raise EnvFailed("error:workflow", outcome.error)
    if not calls.segments:
        raise EnvFailed("error:workflow", "the workflow never called the model: nothing to train")
    if len(calls.segments) > 1:
        raise EnvFailed(
            "error:agent_segments",
            f"the workflow's {calls.num_calls} calls formed {len(calls.segments)} separate "
            "conversations (a rewritten history or a second agent); one per episode is trained",
        )
    take_segment(result, calls.segments[0].result)
    result.reward = outcome.reward
    for name, value in outcome.metadata.items():
        if name != "workflow_s":
            result.env_metrics[f"reward/{name}"] = float(value)
    return "length" if result.turn_finish_reasons[-1] == "length" else "stop"


def take_segment(result: EpisodeResult, segment: EpisodeResult) -> None:
    """The segment's tokens and turns as the episode's (its timing stays)."""
    for name in ("token_ids", "logprobs", "loss_mask", "versions", "turn_finish_reasons"):
        setattr(result, name, list(getattr(segment, name)))
    result.prompt_len, result.num_turns = segment.prompt_len, segment.num_turns
