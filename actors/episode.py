"""Multi-turn episodes, engine- and transport-agnostic: token in, token out.

`run_episode` plays one sample of a prompt against one environment session: the prompt is
templated once; each assistant turn's token ids, logprobs and policy versions come straight
from the engine (loss mask 1); each observation is appended as a templated delta (loss mask
0, version -1). Nothing is re-tokenised. `run_group` (actors/group.py) plays the n samples
of a GRPO group concurrently on one engine (shared prefix cache). `to_trajectory`
(actors/trajectory.py) packs a result for the bus.

Limits, named as in SkyRL:
- `max_input_length`: a context longer than this is not generated from. The first prompt
  being longer rejects the task (`TaskRejected`); later it ends the episode
  (`max_input_length`).
- `max_generate_length`: tokens per assistant turn (vLLM `max_tokens`).
- `max_sequence_length`: prompt + all turns. Generation is capped to fit; a sequence that
  reaches it without finishing is truncated there (`overlong`).
- `max_turns`: assistant turns per episode (`max_turns`).
- DAPO overlong filtering (`overlong_filtering`): an episode cut short by a length limit
  (`overlong`, `max_input_length`, or a last turn that hit `max_generate_length`: `length`)
  keeps its tokens but gets an all-zero loss mask, so truncation is never scored as failure.

A turn cut by `max_generate_length` (no EOS) that the environment does not end is closed
with one EOS token that no policy produced (loss mask 0, logprob 0, version -1), so the
history stays exactly the chat template's rendering and the observation delta applies.

Stop reasons: `stop` (env ended the episode after a turn that ended with EOS), `length`
(env ended it after a turn cut by `max_generate_length`), `max_turns`, `max_input_length`,
`overlong`, `error:env_open` / `error:env_step` (env servers unreachable after retries on
other addresses), `error:env_replay` (a re-opened session did not replay identically),
`error:env_observation` (the env returned messages that cannot be templated),
`error:env_reward` (the env returned a NaN or infinite reward); for an agent workflow's
session (Reset answered kind "workflow": the user's agent runs on the env server against
this replica's endpoint, actors/workflow_episode.py) `error:workflow` and
`error:workflow_env`.
Error episodes carry reward 0.0 and an all-zero loss mask: the learner must leave them out
of group statistics (the stop reason says the reward is not a reward).

Turn-level checkpoints, so an episode outlives its replica: `on_turn` sees the episode after
every turn that does not end it (the actor records it in the broker); an episode given its
`saved` checkpoint continues from that turn (actors/resume.py: the env session is rebuilt by
replaying the recorded actions) or, when the rules refuse it, starts over, saying why.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from actors import metrics, resume
from actors.chat import ChatTemplate
from actors.config import EnvConfig, RolloutConfig, SamplingConfig
from actors.env_retry import EnvFailed, close_session, open_session, replay, step_session
from actors.types import Engine, EnvConnector, EnvSession, EpisodeResult, Generation, Turn
from actors.workflow_episode import play_workflow
from broker.wire import EpisodeCheckpoint, PromptTask
from common.rows import row_problem
from protos.client import EnvUnavailable, TaskRejected
from protos.types import WORKFLOW

if TYPE_CHECKING:
    from actors.agent_endpoint import AgentEndpoint

log = logging.getLogger(__name__)

_LENGTH_LIMITED = ("overlong", "max_input_length", "length")


def task_row(task: PromptTask) -> dict:
    """The SkyRL dataset row an env server's reset() receives."""
    return {
        "data_source": task.data_source,
        "env_class": task.env_class,
        "prompt": [dict(m) for m in task.prompt],
        "reward_spec": dict(task.reward_spec),
        "extra_info": dict(task.extra_info),
    }


MAX_GROUP_SIZE = 1024


def validate_task(task: PromptTask, *, max_group_size: int = MAX_GROUP_SIZE) -> None:
    """Raise TaskRejected for a decodable task that still cannot be run: its scheduling
    fields, and its row by the one SkyRL row validator (common/rows.py)."""
    problems = []
    if not task.task_id:
        problems.append("empty task_id")
    if not 1 <= task.group_size <= max_group_size:
        problems.append(f"group_size {task.group_size} outside [1, {max_group_size}]")
    problem = row_problem(task_row(task))
    if problem is not None:
        problems.append(problem)
    if problems:
        raise TaskRejected(f"malformed prompt task {task.task_id!r}: " + "; ".join(problems))


@dataclass(frozen=True)
class Rollout:
    """Everything an episode is played with besides its task."""

    engine: Engine
    env: EnvConnector
    chat: ChatTemplate
    limits: RolloutConfig
    sampling: SamplingConfig
    env_config: EnvConfig
    """How hard to try the env servers (attempts, backoff)."""
    agents: AgentEndpoint | None = None
    """The endpoint agent workflows call (actors/workflow_episode.py); None: this rollout
    plays stepped environments only."""


OnTurn = Callable[["Episode"], Awaitable[None]]
"""Awaited after each turn that does not end the episode (`result`, `actions`,
`observations` are its state then)."""


async def run_episode(
    rollout: Rollout,
    task: PromptTask,
    *,
    seed: int | None = None,
    saved: EpisodeCheckpoint | None = None,
    on_turn: OnTurn | None = None,
) -> EpisodeResult:
    """Play one episode (with `seed` for its sampling, else `sampling.seed`), from its
    `saved` checkpoint when it can be continued. Raises TaskRejected when the task itself
    cannot be run; env outages end the episode with an `error:*` stop reason instead."""
    limits = rollout.limits
    episode = Episode(rollout, task, seed)
    try:
        await episode.start(saved)
        if episode.is_workflow:
            stop_reason = await play_workflow(
                episode.session, rollout.agents, episode.sampling, episode.seed, episode.result
            )
        else:
            while (stop_reason := await episode.turn()) is None:
                if on_turn is not None:
                    await on_turn(episode)
        episode.result.stop_reason = stop_reason
    except EnvFailed as e:
        result = episode.result
        result.stop_reason, result.error = e.stop_reason, str(e)
        result.reward = 0.0
        result.zero_loss_mask()  # said once for the whole group (actors/group.py)
    finally:
        for opened_session in episode.opened:
            await close_session(opened_session)
        episode.result.timing["end"] = time.time()
    result = episode.result
    if limits.overlong_filtering and result.stop_reason in _LENGTH_LIMITED:
        result.zero_loss_mask()
    return result


class Episode:
    """The state of one episode between turns (history, actions, the open session)."""

    def __init__(self, rollout: Rollout, task: PromptTask, seed: int | None) -> None:
        self.engine, self.env, self.chat = rollout.engine, rollout.env, rollout.chat
        self.limits, self.sampling = rollout.limits, rollout.sampling
        self.env_config = rollout.env_config
        self.task = task
        self.seed = rollout.sampling.seed if seed is None else seed
        self.opened: list[EnvSession] = []  # every session opened, closed at the end
        self._begin()

    def _begin(self) -> None:
        self.result = EpisodeResult(timing={"generate_s": 0.0, "env_s": 0.0, "start": time.time()})
        self.actions: list[str] = []
        self.observations: list[list[dict]] = []
        self.session: EnvSession | None = None

    async def start(self, saved: EpisodeCheckpoint | None = None) -> None:
        """Continue from `saved` when the rules allow (actors/resume.py), else open a
        session and template its prompt (TaskRejected if it cannot be run)."""
        if saved is not None:
            refusal = resume.resume_refusal(saved, self.task, self.engine.version)
            refusal = refusal or await self._resume(saved)
            if refusal is None:
                return
            if self.session is not None:  # opened for the replay: start over on a new one
                self.opened.remove(self.session)
                await close_session(self.session)
            self._begin()
            self.result.resume_refused = refusal
        self.session = await self._open()
        if self.is_workflow:  # the agent's calls make the prompt (actors/workflow_episode.py)
            return
        prompt = self._prompt()
        if len(prompt) > self.limits.max_input_length:
            raise TaskRejected(
                f"task {self.task.task_id!r}: prompt of {len(prompt)} tokens exceeds "
                f"max_input_length {self.limits.max_input_length}"
            )
        self.result.append(prompt)
        self.result.prompt_len = len(prompt)

    @property
    def is_workflow(self) -> bool:
        """Whether the open session is an agent workflow's: run once, not stepped."""
        return self.session is not None and self.session.observation.kind == WORKFLOW

    async def _open(self) -> EnvSession:
        task = self.task
        return await open_session(
            self.env, task.env_class, task_row(task), self.env_config, self.result, self.opened
        )

    def _prompt(self) -> list[int]:
        reset = self.session.observation
        try:
            return self.chat.prompt_ids(reset.messages, reset.tools)
        except ValueError as e:
            what = f"task {self.task.task_id!r}: env reset gave a bad prompt"
            raise TaskRejected(f"{what}: {e}") from e

    async def _resume(self, saved: EpisodeCheckpoint) -> str | None:
        """Rebuild the env session of `saved` and take over its state; the refusal when the
        env does not give back what was recorded."""
        self.session = await self._open()
        if not resume.prompt_matches(saved, self._prompt()):
            return "prompt"
        start = time.perf_counter()
        try:
            await replay(self.session, saved.actions, saved.observations)
        except EnvFailed:
            return "replay"
        except EnvUnavailable:
            return "env"
        finally:
            self.result.timing["env_s"] += time.perf_counter() - start
        resume.restore(self.result, saved)
        self.actions = list(saved.actions)
        self.observations = [list(o) for o in saved.observations]
        return None

    async def turn(self) -> str | None:
        """Generate one assistant turn and step the env with it; the stop reason if the
        episode ended, else None (the observation delta is appended)."""
        result, limits = self.result, self.limits
        if len(result.token_ids) > limits.max_input_length:
            return "max_input_length"
        budget = limits.max_sequence_length - len(result.token_ids)
        if budget <= 0:
            return "overlong"
        max_tokens = min(limits.max_generate_length, budget)
        start = time.perf_counter()
        turn = Turn(self.sampling, max_tokens, (self.chat.eos_token_id,), self.seed)
        generation = await self.engine.generate(list(result.token_ids), turn)
        result.timing["generate_s"] += time.perf_counter() - start
        _check_generation(generation, max_tokens)
        result.append(
            generation.token_ids, logprobs=generation.logprobs, versions=generation.versions
        )
        result.num_turns += 1
        result.turn_finish_reasons.append(generation.finish_reason)
        if undecodable := self.chat.num_undecodable(generation.token_ids):
            metrics.note_undecodable(undecodable, self.chat.num_tokens)
        ended = bool(generation.token_ids) and generation.token_ids[-1] == self.chat.eos_token_id
        if not ended and len(result.token_ids) >= limits.max_sequence_length:
            return "overlong"
        return await self._step(generation, ended)

    async def _step(self, generation: Generation, ended: bool) -> str | None:
        result = self.result
        self.actions.append(self.chat.assistant_text(generation.token_ids))
        step, self.session = await step_session(
            self.env,
            self.session,
            self.task.env_class,
            task_row(self.task),
            self.actions,
            self.observations,
            self.env_config,
            result,
            self.opened,
        )
        if not math.isfinite(step.reward):  # an env bug: never a reward anyone trains on
            raise EnvFailed("error:env_reward", f"the env returned reward {step.reward}")
        result.reward += float(step.reward)
        _record_env_metadata(step.metadata, result)
        if step.done:
            return "stop" if ended else "length"
        if result.num_turns >= self.limits.max_turns:
            return "max_turns"
        self.observations.append(list(step.observations))
        if not ended:
            result.append([self.chat.eos_token_id])  # close the cut turn as the template does
        try:
            delta = self.chat.observation_ids(step.observations)
        except ValueError as e:  # an env bug must not kill the group or loop forever
            raise EnvFailed("error:env_observation", str(e)) from e
        result.append(delta)
        if len(result.token_ids) > self.limits.max_sequence_length:
            result.truncate(self.limits.max_sequence_length)
            return "overlong"
        return None


def _check_generation(generation: Generation, max_tokens: int) -> None:
    n = len(generation.token_ids)
    assert len(generation.logprobs) == n and len(generation.versions) == n, (
        f"engine returned {n} tokens, {len(generation.logprobs)} logprobs, "
        f"{len(generation.versions)} versions"
    )
    assert n <= max_tokens, f"engine returned {n} tokens for max_tokens={max_tokens}"


def _record_env_metadata(metadata: dict | None, result: EpisodeResult) -> None:
    """Numeric env metadata (counts such as num_tool_calls, tool_errors) becomes env metrics;
    the env reports running totals, so the newest value wins."""
    for key, value in (metadata or {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            result.env_metrics[key] = float(value)
    result.num_tool_calls = int(result.env_metrics.get("num_tool_calls", 0))
