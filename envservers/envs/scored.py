"""Tasks that only need scoring: the model answers, a function scores the answer.

    obs = reset(row)         -> the row's prompt, no tools
    step(completion)         -> reward = score(completion, row); done
                                (with retries: a wrong answer gets one more user turn)

`score(completion, row) -> float` is the user's reward function (`reward:pkg.mod:score`, or
a `tether.rewards` entry point) or a built-in one (reasoning-gym's task scorers). It sees the
whole assistant message and the dataset row; it runs in a worker thread, since scorers are
synchronous and some are slow (symbolic maths). A score that is not a finite number is the
scorer's bug: the step fails with an error naming it, never a silent zero.

Retries (`retries = N`, off by default): an answer scoring below `full_score` is told it
was wrong and may answer again, up to N more times; the episode's reward is its last
answer's score (the first is in the metadata as `first_score`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from envservers.types import Environment, EnvProvider, validate_task
from protos.types import Observation, StepResult

Scorer = Callable[[str, dict[str, Any]], Any]

RETRY_MESSAGE = "That answer is not correct. Try again."


class ScoredEnv(Environment):
    def __init__(self, name: str, score: Scorer, *, retries: int = 0, full_score: float = 1.0):
        self.name = name
        self.score = score
        self.retries = retries
        self.full_score = full_score
        self.task: dict[str, Any] = {}
        self.attempts = 0
        self.first_score: float | None = None

    async def reset(self, task: dict[str, Any]) -> Observation:
        self.task = validate_task(task)
        if not task.get("prompt"):
            raise ValueError("task.prompt: a scored task needs the messages to answer")
        return Observation(messages=list(task["prompt"]), tools=[], metadata={})

    async def step(self, action_text: str) -> StepResult:
        value = await asyncio.to_thread(self.score, action_text, self.task)
        reward = finite_score(value, self.name)
        self.attempts += 1
        if self.first_score is None:
            self.first_score = reward
        done = reward >= self.full_score or self.attempts > self.retries
        metadata = {"attempts": self.attempts, "first_score": self.first_score}
        if done:
            return StepResult(observations=[], reward=reward, done=True, metadata=metadata)
        retry = {"role": "user", "content": RETRY_MESSAGE}
        return StepResult(observations=[retry], reward=0.0, done=False, metadata=metadata)


def finite_score(value: Any, name: str) -> float:
    """`value` as a float; ValueError naming the scorer when it is not a finite number."""
    score = as_score(value)
    if score is None:
        raise ValueError(f"reward {name}: returned {value!r}; a score must be a finite number")
    return score


def as_score(value: Any) -> float | None:
    """`value` as a score (a bool is 0 or 1), or None when it is not a finite number."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


class ScoredProvider(EnvProvider):
    def __init__(self, name: str, score: Scorer, *, retries: int = 0, description: str = ""):
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries: must be a whole number >= 0, got {retries!r}")
        self.name = name
        self.score = score
        self.retries = retries
        self.description = description or f"answers scored by {name}"

    def make(self) -> ScoredEnv:
        return ScoredEnv(self.name, self.score, retries=self.retries)
