"""Multi-turn episodes, engine- and transport-agnostic: token in, token out.

`run_episode` plays one sample of a prompt against one environment session: the prompt is
templated once; each assistant turn's token ids, logprobs and policy versions come straight
from the engine (loss mask 1); each observation is appended as a templated delta (loss mask
0, version -1). Nothing is re-tokenised. `run_group` plays the n samples of a GRPO group
concurrently on one engine (shared prefix cache). `to_trajectory` packs a result for the bus.

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
`error:env_reward` (the env returned a NaN or infinite reward).
Error episodes carry reward 0.0 and an all-zero loss mask: the learner must leave them out
of group statistics (the stop reason says the reward is not a reward).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from actors import metrics
from actors.chat import ChatTemplate
from actors.config import EnvConfig, RolloutConfig, SamplingConfig
from actors.env_retry import EnvFailed, close_session, open_session, step_session
from actors.types import Engine, EnvConnector, EnvSession, EpisodeResult, Generation, Turn
from broker.wire import PromptTask
from common.rows import row_problem
from protos.client import TaskRejected

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


async def run_episode(
    rollout: Rollout, task: PromptTask, *, seed: int | None = None
) -> EpisodeResult:
    """Play one episode (with `seed` for its sampling, else `sampling.seed`). Raises
    TaskRejected when the task itself cannot be run; env outages end the episode with an
    `error:*` stop reason instead."""
    limits = rollout.limits
    episode = _Episode(rollout, task, seed)
    result = episode.result
    try:
        await episode.start()
        while (stop_reason := await episode.turn()) is None:
            pass
        result.stop_reason = stop_reason
    except EnvFailed as e:
        result.stop_reason, result.error = e.stop_reason, str(e)
        result.reward = 0.0
        result.zero_loss_mask()  # said once for the whole group (run_group)
    finally:
        for opened_session in episode.opened:
            await close_session(opened_session)
        result.timing["end"] = time.time()
    if limits.overlong_filtering and result.stop_reason in _LENGTH_LIMITED:
        result.zero_loss_mask()
    return result


class _Episode:
    """The state of one episode between turns (history, actions, the open session)."""

    def __init__(self, rollout: Rollout, task: PromptTask, seed: int | None) -> None:
        self.engine, self.env, self.chat = rollout.engine, rollout.env, rollout.chat
        self.limits, self.sampling = rollout.limits, rollout.sampling
        self.env_config = rollout.env_config
        self.task = task
        self.seed = rollout.sampling.seed if seed is None else seed
        self.result = EpisodeResult(timing={"generate_s": 0.0, "env_s": 0.0, "start": time.time()})
        self.actions: list[str] = []
        self.observations: list[list[dict]] = []
        self.opened: list[EnvSession] = []  # every session opened, closed at the end
        self.session: EnvSession | None = None

    async def start(self) -> None:
        """Open a session and template its prompt (TaskRejected if it cannot be run)."""
        task, result = self.task, self.result
        self.session = await open_session(
            self.env, task.env_class, task_row(task), self.env_config, result, self.opened
        )
        reset = self.session.observation
        try:
            prompt = self.chat.prompt_ids(reset.messages, reset.tools)
        except ValueError as e:
            raise TaskRejected(f"task {task.task_id!r}: env reset gave a bad prompt: {e}") from e
        if len(prompt) > self.limits.max_input_length:
            raise TaskRejected(
                f"task {task.task_id!r}: prompt of {len(prompt)} tokens exceeds "
                f"max_input_length {self.limits.max_input_length}"
            )
        result.append(prompt)
        result.prompt_len = len(prompt)

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


async def run_group(
    rollout: Rollout,
    task: PromptTask,
    *,
    on_result: Callable[[int, EpisodeResult], Awaitable[None]] | None = None,
) -> list[EpisodeResult]:
    """Play the task's group_size samples concurrently; results in sample order. A seeded
    `sampling` gives sample i the seed `seed + i`. `on_result(i, result)` is awaited as each
    sample finishes (to publish it at once). If one sample raises (TaskRejected, an engine
    failure), the others are cancelled and that exception is raised."""
    validate_task(task)

    base_seed = rollout.sampling.seed

    async def sample(index: int) -> EpisodeResult:
        seed = None if base_seed is None else base_seed + index
        result = await run_episode(rollout, task, seed=seed)
        if on_result is not None:
            await on_result(index, result)
        return result

    try:
        async with asyncio.TaskGroup() as group:
            episodes = [group.create_task(sample(i)) for i in range(task.group_size)]
    except ExceptionGroup as failures:
        # All samples share one prompt: the first cause speaks for the group.
        raise failures.exceptions[0] from None
    results = [e.result() for e in episodes]
    failed = failed_samples_line(task.task_id, results)
    if failed is not None:
        log.warning(failed)
    return results


def failed_samples_line(task_id: str, results: list[EpisodeResult]) -> str | None:
    """One line for the samples of a group that an env failure ended (`error:*`): how many,
    under which stop reasons, and the error of the first of them; None when none did."""
    failed = [(i, r) for i, r in enumerate(results) if r.stop_reason.startswith("error:")]
    if not failed:
        return None
    reasons = Counter(r.stop_reason for _, r in failed)
    by_reason = ", ".join(f"{reason} x{n}" for reason, n in sorted(reasons.items()))
    first_index, first = failed[0]
    return (
        f"task {task_id}: {len(failed)} of {len(results)} samples ended with an env error "
        f"({by_reason}); sample {first_index}: {first.error}"
    )
