"""reasoning-gym's procedural tasks (PyPI `reasoning-gym`) as scored single-turn environments.

Hosted as `reasoning_gym:TASK`; its rows come from `learner prepare --from reasoning_gym:TASK`
(common/reasoning_gym_tasks.py), which carry the recipe of their entry. Per session:

    reset(row)        -> the row's prompt; the entry regenerated from the recipe (a row
                         without one, or for another task, is refused here, not at step)
    step(completion)  -> reward = the task's own score_answer(<answer>...</answer>, entry)

The answer is reasoning-gym's `extract_answer`: the last `<answer>...</answer>`, stripped;
a completion without one is scored as no answer (None), as reasoning-gym scores it. Settings
(`[envserver.plugins."reasoning_gym:TASK"]`): `retries` only (envservers/envs/scored.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from common import reasoning_gym_tasks
from envservers.envs.scored import ScoredEnv, ScoredProvider
from protos.types import Observation

log = logging.getLogger(__name__)
_warned: set[tuple[str, str]] = set()


def build_provider(task: str, *, retries: int = 0, **unknown: Any) -> ScoredProvider:
    """The provider of `reasoning_gym:TASK`; ValueError for a task reasoning-gym lacks or a
    setting other than `retries`."""
    if unknown:
        raise ValueError(
            f"reasoning_gym:{task}: unknown settings {sorted(unknown)}; the only one is retries"
        )
    reasoning_gym_tasks.check_task(task)
    return ReasoningGymProvider(task, retries=retries)


def score(task: str, completion: str, row: dict[str, Any]) -> float:
    """The task's own score of the completion's final `<answer>` for the row's entry."""
    from reasoning_gym.utils import extract_answer

    dataset, entry = reasoning_gym_tasks.regenerate(row, task=task)
    answer = extract_answer(completion)
    try:
        return dataset.score_answer(answer, entry)
    except Exception as e:  # untrusted model output: some of reasoning-gym's scorers raise
        # on malformed answers (prime_factorization on "A B", coin_flip on "-1e999"); a
        # malformed answer scores 0 and never fails the step. Said once per task and error.
        if (task, type(e).__name__) not in _warned:
            _warned.add((task, type(e).__name__))
            log.warning("reasoning_gym:%s: score_answer raised %r; scored 0", task, e)
        return 0.0


class ReasoningGymEnv(ScoredEnv):
    def __init__(self, task: str, *, retries: int):
        super().__init__(f"reasoning_gym:{task}", functools.partial(score, task), retries=retries)
        self.rg_task = task

    async def reset(self, task: dict[str, Any]) -> Observation:
        observation = await super().reset(task)
        await asyncio.to_thread(reasoning_gym_tasks.regenerate, task, task=self.rg_task)
        return observation


class ReasoningGymProvider(ScoredProvider):
    def __init__(self, task: str, *, retries: int = 0):
        super().__init__(
            f"reasoning_gym:{task}",
            functools.partial(score, task),
            retries=retries,
            description=f"reasoning-gym task {task!r}, scored by its own score_answer",
        )
        self.task = task

    def make(self) -> ReasoningGymEnv:
        return ReasoningGymEnv(self.task, retries=self.retries)
