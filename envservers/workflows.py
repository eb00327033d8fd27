"""Agent workflows: the user's own agent loop, run as it is, scored by what it returns.

    async def solve(client: openai.AsyncOpenAI, task: dict) -> float | dict: ...

`client` is pointed at the chat-completions endpoint of the actor replica playing the
episode (actors/agent_endpoint.py), under a key naming that episode; `task` is the dataset
row. The actor records the tokens of every call underneath, so the agent's code never
changes to be trained. The return value is the episode's reward: a number, or a dict with a
`reward` and named components (numbers too, logged per component).

A workflow session is opened by Reset like any other (the row is checked and kept) and run
once by RunWorkflow, with a time limit. Whatever the agent's code does wrong (raises, runs
past the limit, returns no score) is the outcome's `error`, never a failed server call: the
actor ends that episode as an error and the group is replaced, as for an env failure.

Workflows run here, on the env servers, not in the actor: they already isolate user code
(tools, sandboxes) and scale apart from the engines (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from common.plugins import PluginError, one_line
from envservers.envs.scored import as_score
from envservers.types import Environment, EnvProvider, validate_task
from protos.types import WORKFLOW, Observation, StepResult, WorkflowOutcome

Workflow = Callable[..., Awaitable[Any]]

DEFAULT_TIME_LIMIT_S = 300.0

# The client logs every request at INFO: a line per model call of every episode would bury
# the server's own log. Its warnings and errors still show.
for _name in ("httpx", "httpx2"):  # openai's HTTP client, by release
    logging.getLogger(_name).setLevel(logging.WARNING)


class NoScore(ValueError):
    """What a workflow returned is not a score."""


def workflow_score(value: Any) -> tuple[float, dict[str, float]]:
    """(reward, components) of what a workflow returned; NoScore saying what is wrong when
    it is not a finite number or a dict with one under `reward`."""
    if isinstance(value, dict):
        if "reward" not in value:
            raise NoScore(
                f"returned a dict without 'reward' (keys: {sorted(map(str, value))}); "
                "return a number, or {'reward': number, 'component': number, ...}"
            )
        components = {str(k): _number(v, f"[{k!r}]") for k, v in value.items() if k != "reward"}
        return _number(value["reward"], "['reward']"), components
    return _number(value, ""), {}


def _number(value: Any, where: str) -> float:
    score = as_score(value)
    if score is None:
        raise NoScore(
            f"returned{' ' + where if where else ''} {value!r}: a score must be a finite number"
        )
    return score


class WorkflowEnv(Environment):
    """One episode of a workflow: the row at reset, one run against an endpoint."""

    def __init__(
        self,
        name: str,
        workflow: Workflow,
        settings: dict[str, Any],
        time_limit_s: float,
        clients: Clients,
    ):
        self.name, self.workflow = name, workflow
        self.settings, self.time_limit_s = settings, time_limit_s
        self.clients = clients
        self.task: dict[str, Any] = {}

    async def reset(self, task: dict[str, Any]) -> Observation:
        self.task = validate_task(task)
        metadata = {"time_limit_s": self.time_limit_s, "workflow": self.name}
        return Observation(messages=list(task.get("prompt", [])), metadata=metadata, kind=WORKFLOW)

    async def step(self, action_text: str) -> StepResult:
        raise TypeError(f"{self.name} is a workflow: it is run (RunWorkflow), not stepped")

    async def run(self, base_url: str, api_key: str) -> WorkflowOutcome:
        """Run the agent once against `base_url` with `api_key`; its score, or its error."""
        client = self.clients.client(base_url, api_key, self.time_limit_s)
        limit = asyncio.timeout(self.time_limit_s)
        try:
            async with limit:
                value = await self.workflow(client, self.task, **self.settings)
            reward, components = workflow_score(value)
            outcome = WorkflowOutcome(reward=reward, metadata=dict(components))
        except TimeoutError as e:
            if not limit.expired():
                outcome = WorkflowOutcome(error=f"{self.name}: {one_line(e)}")
            else:
                outcome = WorkflowOutcome(
                    error=f"{self.name}: ran past its time limit ({self.time_limit_s:g} s)"
                )
        except NoScore as e:
            outcome = WorkflowOutcome(error=f"{self.name}: {e}")
        except Exception as e:  # the user's code: its failure is the episode's, not ours
            outcome = WorkflowOutcome(error=f"{self.name}: {one_line(e)}")
        return outcome


class Clients:
    """`openai` clients for the episodes, on one shared connection pool: a client of its own
    builds an SSL context and a pool (~40 ms of CPU), which for short agent calls cost more
    than the calls. The pool is the SDK's aiohttp transport (`DefaultAioHttpClient`): an
    episode's two calls took 15% less CPU, client and endpoint together, than on its default
    httpx one. An episode's `client.close()` (an `async with client:`) leaves the pool open
    for the others; the server closes it when it stops."""

    def __init__(self) -> None:
        self.pool: Any = None
        self.client_class: Any = None

    def client(self, base_url: str, api_key: str, timeout_s: float) -> Any:
        if self.pool is None:
            import openai  # only a server hosting workflows needs the client

            class EpisodeClient(openai.AsyncOpenAI):
                async def close(self) -> None:
                    pass  # the pool is the server's (Clients.close)

            self.pool = openai.DefaultAioHttpClient()
            self.client_class = EpisodeClient
        return self.client_class(base_url=base_url, api_key=api_key, max_retries=0,
                                 timeout=timeout_s, http_client=self.pool)  # fmt: skip

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()
            self.pool = None


class WorkflowProvider(EnvProvider):
    def __init__(
        self, name: str, workflow: Workflow, settings: dict[str, Any], time_limit_s: float
    ) -> None:
        self.name, self.workflow = name, workflow
        self.settings, self.time_limit_s = settings, time_limit_s
        self.description = f"agent workflow {name}"
        self.clients = Clients()

    def make(self) -> WorkflowEnv:
        return WorkflowEnv(self.name, self.workflow, self.settings, self.time_limit_s, self.clients)

    async def stop(self) -> None:
        await self.clients.close()


def workflow_provider(name: str, spec: str, workflow: Any, settings: dict[str, Any]) -> EnvProvider:
    """The provider of the workflow `spec` names, served as `name`. `time_limit_s` is ours;
    the other settings go to the workflow as keyword arguments. PluginError unless it is an
    async function that takes (client, task, **settings)."""
    settings = dict(settings)
    time_limit_s = settings.pop("time_limit_s", DEFAULT_TIME_LIMIT_S)
    if (
        isinstance(time_limit_s, bool)
        or not isinstance(time_limit_s, int | float)
        or not time_limit_s > 0
    ):
        raise PluginError(
            f"{spec}: time_limit_s must be a number of seconds > 0, got {time_limit_s!r}"
        )
    if not inspect.iscoroutinefunction(workflow):
        raise PluginError(
            f"{spec}: names a {type(workflow).__name__}; a workflow is "
            "`async def run(client, task) -> float | dict`"
        )
    try:
        inspect.signature(workflow).bind("client", {}, **settings)
    except TypeError as e:
        raise PluginError(
            f"{spec}: cannot be called as run(client, task, **settings) with the settings "
            f"{sorted(settings)}: {e}"
        ) from None
    return WorkflowProvider(name, workflow, settings, float(time_limit_s))
