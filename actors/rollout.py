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
`error:env_observation` (the env returned messages that cannot be templated).
Error episodes carry reward 0.0 and an all-zero loss mask: the learner must leave them out
of group statistics (the stop reason says the reward is not a reward).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from actors.chat import ChatTemplate
from broker.codec import pack_tokens
from broker.wire import PromptTask, Trajectory
from protos.client import EnvUnavailable, TaskRejected

log = logging.getLogger(__name__)

NO_POLICY_VERSION = -1
"""Version tag of tokens no policy generated (prompt, observations, a closing EOS)."""


# ---- the engine interface (contracts.md) --------------------------------------------------------


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    """Logprob of each sampled token under the behaviour policy."""
    finish_reason: str
    """`stop` (ended on a stop token, included in token_ids) or `length` (hit max_tokens)."""
    versions: list[int]
    """Policy version of the weights that produced each token."""


class Engine(Protocol):
    async def generate(self, prompt_token_ids: list[int], params: SamplingSpec) -> Generation: ...


# ---- the environment interface (contracts.md; protos.client sessions) -----------------------


class EnvSession(Protocol):
    observation: Any
    """After reset: `.messages` (prompt messages), `.tools` (tool specs), `.metadata`."""

    async def step(self, action_text: str) -> Any:
        """-> `.observations` (messages), `.reward`, `.done`, `.metadata`."""
        ...

    async def close(self) -> None: ...


class EnvConnector(Protocol):
    async def open(self, env_class: str, task: dict) -> EnvSession:
        """Open and reset a session; each call may pick another server address.
        Raises EnvUnavailable (retryable) or TaskRejected (never retry this task)."""
        ...


# ---- configuration of one rollout ---------------------------------------------------------------


@dataclass(frozen=True)
class RolloutLimits:
    max_turns: int = 8
    max_input_length: int = 4096
    max_generate_length: int = 1024
    max_sequence_length: int = 8192
    overlong_filtering: bool = True

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_input_length", "max_generate_length", "max_sequence_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_input_length > self.max_sequence_length:
            raise ValueError(
                f"max_input_length ({self.max_input_length}) must not exceed "
                f"max_sequence_length ({self.max_sequence_length})"
            )


@dataclass(frozen=True)
class EnvRetry:
    """How hard to try an env server before the episode ends with an error stop reason."""

    attempts: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def delay_s(self, attempt: int) -> float:
        return min(self.backoff_s * 2**attempt, self.max_backoff_s)


# ---- results ------------------------------------------------------------------------------------


@dataclass
class EpisodeResult:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    prompt_len: int = 0
    reward: float = 0.0
    stop_reason: str = ""
    num_turns: int = 0
    num_tool_calls: int = 0
    num_env_retries: int = 0
    env_metrics: dict[str, float] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    """generate_s, env_s (open + steps), start, end (unix seconds)."""
    turn_finish_reasons: list[str] = field(default_factory=list)
    env_step_latencies_s: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def num_generated_tokens(self) -> int:
        return sum(1 for v in self.versions if v != NO_POLICY_VERSION)

    def append(self, ids: list[int], *, logprobs=None, versions=None) -> None:
        """Append policy tokens (with logprobs and versions) or, without them, fixed tokens."""
        self.token_ids.extend(ids)
        if versions is None:
            self.logprobs.extend([0.0] * len(ids))
            self.loss_mask.extend([0] * len(ids))
            self.versions.extend([NO_POLICY_VERSION] * len(ids))
        else:
            self.logprobs.extend(logprobs)
            self.loss_mask.extend([1] * len(ids))
            self.versions.extend(versions)

    def truncate(self, length: int) -> None:
        for name in ("token_ids", "logprobs", "loss_mask", "versions"):
            del getattr(self, name)[length:]

    def zero_loss_mask(self) -> None:
        self.loss_mask = [0] * len(self.loss_mask)


_LENGTH_LIMITED = ("overlong", "max_input_length", "length")


class _EnvFailed(Exception):
    def __init__(self, stop_reason: str, detail: str) -> None:
        super().__init__(detail)
        self.stop_reason = stop_reason


# ---- one episode --------------------------------------------------------------------------------


def task_row(task: PromptTask) -> dict:
    """The SkyRL dataset row an env server's reset() receives."""
    return {
        "data_source": task.data_source,
        "env_class": task.env_class,
        "prompt": [dict(m) for m in task.prompt],
        "reward_spec": dict(task.reward_spec),
        "extra_info": dict(task.extra_info),
    }


def validate_task(task: PromptTask, *, max_group_size: int = 1024) -> None:
    """Raise TaskRejected for a decodable task that still cannot be run."""
    problems = []
    if not task.task_id:
        problems.append("empty task_id")
    if not task.env_class:
        problems.append("empty env_class")
    if not 1 <= task.group_size <= max_group_size:
        problems.append(f"group_size {task.group_size} outside [1, {max_group_size}]")
    if not task.prompt:
        problems.append("empty prompt")
    for i, m in enumerate(task.prompt):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            problems.append(f"prompt message {i} lacks a string role or content")
    if problems:
        raise TaskRejected(f"malformed prompt task {task.task_id!r}: " + "; ".join(problems))


async def run_episode(
    *,
    engine: Engine,
    env: EnvConnector,
    chat: ChatTemplate,
    task: PromptTask,
    limits: RolloutLimits,
    sampling: SamplingSpec,
    env_retry: EnvRetry = EnvRetry(),
) -> EpisodeResult:
    """Play one episode. Raises TaskRejected when the task itself cannot be run; env outages
    end the episode with an `error:*` stop reason instead."""
    result = EpisodeResult(timing={"generate_s": 0.0, "env_s": 0.0, "start": time.time()})
    stop_tokens = tuple(sorted({*sampling.stop_token_ids, chat.eos_token_id}))
    actions: list[str] = []
    observations: list[list[dict]] = []
    opened: list[EnvSession] = []  # every session this episode opened, closed at the end
    try:
        session = await _open(env, task, env_retry, result, opened)
        reset = session.observation
        try:
            prompt = chat.prompt_ids(reset.messages, reset.tools)
        except ValueError as e:
            raise TaskRejected(f"task {task.task_id!r}: env reset gave a bad prompt: {e}") from e
        if len(prompt) > limits.max_input_length:
            raise TaskRejected(
                f"task {task.task_id!r}: prompt of {len(prompt)} tokens exceeds "
                f"max_input_length {limits.max_input_length}"
            )
        result.append(prompt)
        result.prompt_len = len(prompt)

        while True:
            if len(result.token_ids) > limits.max_input_length:
                result.stop_reason = "max_input_length"
                break
            budget = limits.max_sequence_length - len(result.token_ids)
            if budget <= 0:
                result.stop_reason = "overlong"
                break
            params = dataclasses.replace(
                sampling,
                max_tokens=min(limits.max_generate_length, budget),
                stop_token_ids=stop_tokens,
            )
            start = time.perf_counter()
            generation = await engine.generate(list(result.token_ids), params)
            result.timing["generate_s"] += time.perf_counter() - start
            _check_generation(generation, params.max_tokens)
            result.append(
                generation.token_ids, logprobs=generation.logprobs, versions=generation.versions
            )
            result.num_turns += 1
            result.turn_finish_reasons.append(generation.finish_reason)
            ended = bool(generation.token_ids) and generation.token_ids[-1] == chat.eos_token_id
            if not ended and len(result.token_ids) >= limits.max_sequence_length:
                result.stop_reason = "overlong"
                break

            actions.append(chat.assistant_text(generation.token_ids))
            step, session = await _step(
                env, session, task, actions, observations, env_retry, result, opened
            )
            result.reward += float(step.reward)
            _record_env_metadata(step.metadata, result)
            if step.done:
                result.stop_reason = "stop" if ended else "length"
                break
            if result.num_turns >= limits.max_turns:
                result.stop_reason = "max_turns"
                break
            observations.append(list(step.observations))
            if not ended:
                result.append([chat.eos_token_id])  # close the cut turn as the template does
            try:
                delta = chat.observation_ids(step.observations)
            except ValueError as e:  # an env bug must not kill the group or loop forever
                raise _EnvFailed("error:env_observation", str(e)) from e
            result.append(delta)
            if len(result.token_ids) > limits.max_sequence_length:
                result.truncate(limits.max_sequence_length)
                result.stop_reason = "overlong"
                break
    except _EnvFailed as e:
        result.stop_reason, result.error = e.stop_reason, str(e)
        result.reward = 0.0
        result.zero_loss_mask()
        log.warning("episode of task %s ended with %s: %s", task.task_id, e.stop_reason, e)
    finally:
        for opened_session in opened:
            await _close(opened_session)
        result.timing["end"] = time.time()

    if limits.overlong_filtering and result.stop_reason in _LENGTH_LIMITED:
        result.zero_loss_mask()
    return result


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
        if isinstance(value, int | float) and not isinstance(value, bool):
            result.env_metrics[key] = float(value)
    result.num_tool_calls = int(result.env_metrics.get("num_tool_calls", 0))


async def _open(
    env: EnvConnector,
    task: PromptTask,
    retry: EnvRetry,
    result: EpisodeResult,
    opened: list[EnvSession],
) -> EnvSession:
    """Open a session, retrying with backoff (the connector moves to another address)."""
    last_error: Exception | None = None
    for attempt in range(retry.attempts):
        if attempt:
            result.num_env_retries += 1
            await asyncio.sleep(retry.delay_s(attempt - 1))
        start = time.perf_counter()
        try:
            session = await env.open(task.env_class, task_row(task))
            opened.append(session)
            return session
        except EnvUnavailable as e:  # retryable by contract
            last_error = e
        finally:
            result.timing["env_s"] += time.perf_counter() - start
    raise _EnvFailed("error:env_open", f"{retry.attempts} attempts failed, last: {last_error}")


async def _step(
    env: EnvConnector,
    session: EnvSession,
    task: PromptTask,
    actions: list[str],
    observations: list[list[dict]],
    retry: EnvRetry,
    result: EpisodeResult,
    opened: list[EnvSession],
) -> tuple[Any, EnvSession]:
    """Step with the newest action. If the server fails, open a session elsewhere, replay the
    earlier actions (they must reproduce the recorded observations), and step again."""
    last_error: Exception | None = None
    for attempt in range(retry.attempts):
        if attempt:
            result.num_env_retries += 1
            await asyncio.sleep(retry.delay_s(attempt - 1))
            await _close(session)
            try:
                session = await _open(env, task, retry, result, opened)
            except _EnvFailed as e:
                raise _EnvFailed("error:env_step", f"re-opening after {last_error}: {e}") from e
            start = time.perf_counter()
            try:
                await _replay(session, actions[:-1], observations)
            except EnvUnavailable as e:
                last_error = e
                continue
            finally:
                result.timing["env_s"] += time.perf_counter() - start
        start = time.perf_counter()
        try:
            step = await session.step(actions[-1])
        except EnvUnavailable as e:
            last_error = e
            continue
        finally:
            result.timing["env_s"] += time.perf_counter() - start
        result.env_step_latencies_s.append(time.perf_counter() - start)
        return step, session
    raise _EnvFailed("error:env_step", f"{retry.attempts} attempts failed, last: {last_error}")


async def _replay(session: EnvSession, actions: list[str], observations: list[list[dict]]) -> None:
    for action, expected in zip(actions, observations, strict=True):
        step = await session.step(action)
        if step.done or list(step.observations) != expected:
            raise _EnvFailed(
                "error:env_replay", "a re-opened env session did not replay the episode"
            )


async def _close(session: EnvSession) -> None:
    try:
        await session.close()
    except EnvUnavailable as e:  # the server is gone; its session went with it
        log.info("closing env session failed: %s", e)


# ---- a GRPO group -------------------------------------------------------------------------------


async def run_group(
    *,
    engine: Engine,
    env: EnvConnector,
    chat: ChatTemplate,
    task: PromptTask,
    limits: RolloutLimits,
    sampling: SamplingSpec,
    env_retry: EnvRetry = EnvRetry(),
    on_result: Callable[[int, EpisodeResult], Awaitable[None]] | None = None,
) -> list[EpisodeResult]:
    """Play the task's group_size samples concurrently; results in sample order. A seeded
    `sampling` gives sample i the seed `seed + i`. `on_result(i, result)` is awaited as each
    sample finishes (to publish it at once). If one sample raises (TaskRejected, an engine
    failure), the others are cancelled and that exception is raised."""
    validate_task(task)

    async def sample(index: int) -> EpisodeResult:
        result = await run_episode(
            engine=engine,
            env=env,
            chat=chat,
            task=task,
            limits=limits,
            sampling=_sample_seed(sampling, index),
            env_retry=env_retry,
        )
        if on_result is not None:
            await on_result(index, result)
        return result

    try:
        async with asyncio.TaskGroup() as group:
            episodes = [group.create_task(sample(i)) for i in range(task.group_size)]
    except ExceptionGroup as failures:
        # All samples share one prompt: the first cause speaks for the group.
        raise failures.exceptions[0] from None
    return [e.result() for e in episodes]


def _sample_seed(sampling: SamplingSpec, index: int) -> SamplingSpec:
    if sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=sampling.seed + index)


# ---- to the wire --------------------------------------------------------------------------------


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
