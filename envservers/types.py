"""The environment interface in message space, shared by the server, the built-in
environments and the adapters (its result types, `Observation` and `StepResult`, are the
service contract's and live in protos/types.py, with the gRPC client).

It has the shape of skyrl-gym's `BaseTextEnv` (`init` -> prompt, `step` -> observations,
reward, done, metadata) with async methods, because most of our environments wait on
something (a sandboxed process, an MCP server, an OpenEnv server) and many sessions share
one event loop:

    obs = await env.reset(task)          # task = one SkyRL dataset row (dict)
    result = await env.step(action_text) # one assistant message
    await env.close()

Messages are OpenAI-style dicts ({"role": ..., "content": ...}); tool specs are OpenAI
function specs ({"type": "function", "function": {"name", "description", "parameters"}}).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from common.rows import messages_problem
from protos.types import Observation, StepResult


class Environment(ABC):
    """One episode of one environment. A new instance per session."""

    @abstractmethod
    async def reset(self, task: dict[str, Any]) -> Observation:
        """Start the episode from a dataset row. Raise ValueError if the row is unusable."""

    @abstractmethod
    async def step(self, action_text: str) -> StepResult:
        """Consume one assistant message. Malformed model output is an observation (or a
        zero reward), never an exception."""

    async def close(self) -> None:  # noqa: B027 (optional hook: most envs hold nothing)
        """Free what the episode holds. Called once; must not raise on a half-reset env."""


class EnvProvider:
    """Server-wide factory for one environment name: `make()` gives a fresh Environment per
    session; `start()`/`stop()` hold what sessions share (MCP server processes, ...)."""

    description: str = ""

    async def start(self) -> None:
        pass

    def make(self) -> Environment:
        raise NotImplementedError

    async def stop(self) -> None:
        pass


def validate_task(task: Any) -> dict[str, Any]:
    """Check the parts of a SkyRL dataset row every environment relies on (its prompt
    messages; `reward_spec` and `extra_info` objects when present); raise ValueError naming
    the field. Environments needing more (a ground truth) check it themselves. Returns the
    task."""
    if not isinstance(task, dict):
        raise ValueError("task: must be a JSON object (a SkyRL dataset row)")
    prompt = task.get("prompt", [])
    if not isinstance(prompt, list):
        raise ValueError("task.prompt: must be a list of messages")
    if prompt and (problem := messages_problem(prompt, field="task.prompt")) is not None:
        raise ValueError(problem)
    for key in ("reward_spec", "extra_info"):
        if task.get(key) is not None and not isinstance(task[key], dict):
            raise ValueError(f"task.{key}: must be an object")
    return task
