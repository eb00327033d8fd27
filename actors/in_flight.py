"""How much work a replica takes, so slow tools never leave its engine idle: by its engine's
room, not a fixed count (docs/running.md, "Slow tools").

    take more tasks while  episodes wanting the engine + one more group  <=  max_num_seqs

An episode wants the engine unless it is waiting on an env server (a tool call, a reset; for
an agent workflow, its whole run except while one of its calls generates): one waiting on a
tool holds no engine slot, and its next turn is generated when the tool
answers, on the newest weights the bound allows. So a tool-heavy workload keeps many more
groups in flight than the engine has slots, and its cores stay busy while tools run. How
many in all is bounded by what the dispatcher released, i.e. by the staleness bound
(learner/dispatcher.py). With several replicas, each takes by its own engine's room, so
work spreads by load. `actor.max_groups_in_flight`, when set, is a cap on top.

`tasks_to_take` is the rule, pure; `EngineDemand` keeps its live counts (episodes of the
groups held, and those of them at an env server) and wakes the pulling loop when they fall.
"""

from __future__ import annotations

import asyncio
from typing import Any

from actors import metrics
from actors.episode import MAX_GROUP_SIZE
from actors.types import Engine, EnvConnector, EnvSession, Generation, Turn
from protos.types import StepResult, WorkflowOutcome


def tasks_to_take(
    *,
    engine_slots: int,
    wanting_engine: int,
    groups: int,
    group_size: int | None,
    max_groups: int | None = None,
) -> int:
    """How many more prompt tasks to pull now. `group_size` is the largest group seen so
    far (None before the first task: take one and learn it); a group alone may be larger
    than the engine (vLLM queues what does not fit), so an idle replica always takes one."""
    fit = 1 if group_size is None else (engine_slots - wanting_engine) // group_size
    if groups == 0:
        fit = max(fit, 1)
    if max_groups is not None:
        fit = min(fit, max_groups - groups)
    return max(fit, 0)


class EngineDemand:
    """The replica's live counts for `tasks_to_take`. `changed` is set whenever room may
    have opened (episodes ended, or one went to an env server); the pulling loop clears it
    before it reads the counts."""

    def __init__(self) -> None:
        self.episodes = 0
        """Episodes of the groups held (from the moment a task is taken until each ends)."""
        self.at_env = 0
        """Of them, those inside an env server call (open and reset, step, close)."""
        self.largest_group: int | None = None
        self.changed = asyncio.Event()

    @property
    def wanting_engine(self) -> int:
        return self.episodes - self.at_env

    def take_group(self, group_size: int) -> int:
        """Count a task's episodes from the moment it is taken (before it runs); returns
        how many were counted, for `end_episodes`. A malformed size (rejected when the
        task runs) counts nothing and teaches nothing."""
        if not 1 <= group_size <= MAX_GROUP_SIZE:
            return 0
        self.episodes += group_size
        self.largest_group = max(group_size, self.largest_group or 0)
        return group_size

    def end_episodes(self, count: int) -> None:
        self.episodes -= count
        self.changed.set()

    def counting(self, env: EnvConnector) -> EnvConnector:
        """`env`, with the time each call is in flight counted in `at_env`."""
        return _CountedEnv(env, self)

    def for_agents(self, engine: Engine) -> Engine:
        """`engine` as agent workflows call it (actors/agent_endpoint.py): a workflow's run
        is counted at its env server (`counting`), so each of its calls takes the episode
        back to the engine while it generates. An agent that waits on a slow tool of its
        own then holds no engine slot, as a stepped episode at a tool does not."""
        return _AgentCalls(engine, self)

    async def at_env_server(self, call) -> Any:
        self.at_env += 1
        metrics.EPISODES_AT_ENV.inc()
        self.changed.set()
        try:
            return await call
        finally:
            self.at_env -= 1
            metrics.EPISODES_AT_ENV.dec()


class _CountedEnv:
    def __init__(self, env: EnvConnector, demand: EngineDemand) -> None:
        self._env, self._demand = env, demand

    async def open(self, env_class: str, task: dict) -> EnvSession:
        session = await self._demand.at_env_server(self._env.open(env_class, task))
        return _CountedSession(session, self._demand)


class _CountedSession:
    def __init__(self, session: EnvSession, demand: EngineDemand) -> None:
        self._session, self._demand = session, demand

    @property
    def observation(self):
        return self._session.observation

    async def step(self, action_text: str) -> StepResult:
        return await self._demand.at_env_server(self._session.step(action_text))

    async def run_workflow(self, base_url: str, api_key: str) -> WorkflowOutcome:
        # At the env server but while its calls generate (EngineDemand.for_agents).
        return await self._demand.at_env_server(self._session.run_workflow(base_url, api_key))

    async def close(self) -> None:
        await self._demand.at_env_server(self._session.close())


class _AgentCalls:
    def __init__(self, engine: Engine, demand: EngineDemand) -> None:
        self._engine, self._demand = engine, demand

    @property
    def version(self) -> int:
        return self._engine.version

    async def generate(self, prompt_token_ids: list[int], turn: Turn) -> Generation:
        demand = self._demand
        demand.at_env -= 1
        metrics.EPISODES_AT_ENV.dec()
        try:
            return await self._engine.generate(prompt_token_ids, turn)
        finally:
            demand.at_env += 1
            metrics.EPISODES_AT_ENV.inc()
            demand.changed.set()
