"""Workflow episodes: the user's agent loop runs on an env server (envservers/workflows.py)
and calls this replica's chat-completions endpoint (actors/agent_endpoint.py) under a key
naming the episode; the episode is what those calls recorded, token in / token out, and
its reward is what the agent returned.

    open the session (Reset: kind "workflow")     ─ as any episode (actors/episode.py)
    key = endpoint.open_episode(sampling, seed)
    RunWorkflow(session, base_url, key)           ─ the agent's calls land in `calls`
    endpoint.close_episode(key)                   ─ the key is refused from now on
    its conversations → the episode's tokens, logprobs, versions, loss mask; reward

An agent's calls usually form one conversation. Calls that do not extend it (a second agent
in the same episode, such as a critic; a history the agent rewrote) start another
(actors/agent_calls.py). The trajectory then holds them one after another with
`segment_starts` marking where each begins: the learner trains each as a sequence of its own
(no token attends to another conversation's), all with the episode's reward and advantage,
since the agent's one score is for all of them. Counted (`agent_conversations` in the env
metrics) and said once per replica, never merged into one sequence.

Stop reasons besides the stepped episode's: `error:workflow` (the agent's code raised, ran
past its time limit, returned no score, or never called the model) and `error:workflow_env`
(the env server could not run it).

A workflow episode has no turn checkpoints: the agent's state lives in its own code, so a
redelivered task plays it again from the start.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from actors.config import SamplingConfig
from actors.env_retry import EnvFailed
from actors.types import EnvSession, EpisodeResult
from protos.client import EnvUnavailable

if TYPE_CHECKING:
    from actors.agent_endpoint import AgentEndpoint

log = logging.getLogger(__name__)


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
        # Time in tools is the run less its model calls, as for a stepped episode: the auto
        # staleness bound reads it (learner/env_metrics.py, time_in_tools).
        result.timing["generate_s"] += calls.generate_s
        result.timing["env_s"] += time.perf_counter() - start - calls.generate_s
    if outcome.error:
        raise EnvFailed("error:workflow", outcome.error)
    if not calls.segments:
        raise EnvFailed("error:workflow", "the workflow never called the model: nothing to train")
    take_conversations(result, [segment.result for segment in calls.segments])
    if len(calls.segments) > 1:
        _say_once(len(calls.segments))
    result.env_metrics["agent_conversations"] = float(len(calls.segments))
    result.reward = outcome.reward
    for name, value in outcome.metadata.items():  # the named reward components
        result.env_metrics[f"reward/{name}"] = float(value)
    return "length" if calls.last_finish_reason == "length" else "stop"


def take_conversations(result: EpisodeResult, conversations: list[EpisodeResult]) -> None:
    """The conversations' tokens and turns as the episode's, one after another, each
    after the first marked in `segment_starts` (the episode's timing stays)."""
    for conversation in conversations:
        if result.token_ids:
            result.segment_starts.append(len(result.token_ids))
        for name in ("token_ids", "logprobs", "loss_mask", "versions", "turn_finish_reasons"):
            getattr(result, name).extend(getattr(conversation, name))
        result.num_turns += conversation.num_turns
    result.prompt_len = conversations[0].prompt_len


_said: list[bool] = []


def _say_once(count: int) -> None:
    if not _said:
        _said.append(True)
        log.info(
            "an agent episode's calls formed %d conversations (a second agent, or a rewritten "
            "history): each is trained as a sequence of its own with the episode's reward; "
            "the env metric agent_conversations counts them (said once)",
            count,
        )
