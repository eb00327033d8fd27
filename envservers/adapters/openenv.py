"""Proxy an OpenEnv (`openenv-core`) environment server as one of our environments, hosted
as `openenv:NAME` with `[envserver.openenv.NAME]` (see config.OpenEnvConfig).

Each session holds its own WebSocket session on the OpenEnv server (GenericEnvClient: plain
dicts, no env-specific package needed) and resets it with
`task.extra_info.reset_kwargs` (e.g. {"seed": 3}).

text mode  — Gym-style envs (echo, games):
    reset -> prompt + [{"role": "user", "content": <reset observation>}]
    step(text) -> OpenEnv step({action_field: text})
               -> [{"role": "user", "content": <observation>}], its reward, its done
tools mode — MCP envs (OpenEnv's MCPEnvironment: list_tools / call_tool actions):
    reset -> prompt, tool specs from list_tools
    step(text) -> our usual tool episode (envservers/tool_env.py); each parsed call is a
                  call_tool action, its result a tool message; OpenEnv's rewards add up and
                  its done ends the episode; an <answer> is scored as in our own envs.
"""

from __future__ import annotations

import json
from typing import Any

from envservers.config import OpenEnvConfig
from envservers.tool_env import ToolEnv
from envservers.tools import Tool, ToolError, ToolGroup, ToolUnavailable
from envservers.types import Environment, EnvProvider, validate_task
from protos.types import Observation, StepResult


def render(observation: Any, field: str | None = None) -> str:
    """An OpenEnv observation dict as the text the model reads."""
    if field is not None and isinstance(observation, dict):
        observation = observation.get(field, "")
    if isinstance(observation, str):
        return observation
    return json.dumps(observation, default=str)


def tool_result_text(result: Any) -> str:
    """A call_tool result (FastMCP CallToolResult as JSON, or a plain value) as text."""
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        texts = [c.get("text", "") for c in result["content"] if isinstance(c, dict)]
        return "\n".join(texts)
    if isinstance(result, dict) and "data" in result:
        return render(result["data"])
    return render(result)


async def _open_client(config: OpenEnvConfig, task: dict[str, Any]):
    from openenv.core.generic_client import GenericEnvClient

    client = GenericEnvClient(base_url=config.base_url, message_timeout_s=config.message_timeout_s)
    try:
        await client.connect()
    except ConnectionError as e:
        raise ToolUnavailable(f"OpenEnv server {config.base_url}: {e}") from e
    reset_kwargs = (task.get("extra_info") or {}).get("reset_kwargs", {})
    if not isinstance(reset_kwargs, dict):
        await client.close()
        raise ValueError("task.extra_info.reset_kwargs: must be an object")
    return client, await client.reset(**reset_kwargs)


class OpenEnvTextEnv(Environment):
    def __init__(self, config: OpenEnvConfig):
        self.config = config
        self.client: Any = None

    async def reset(self, task: dict[str, Any]) -> Observation:
        validate_task(task)
        self.client, first = await _open_client(self.config, task)
        content = render(first.observation, self.config.observation_field)
        return Observation(
            messages=[*task.get("prompt", []), {"role": "user", "content": content}],
            metadata={"openenv_reward": first.reward, "openenv_done": first.done},
        )

    async def step(self, action_text: str) -> StepResult:
        result = await self.client.step({self.config.action_field: action_text})
        content = render(result.observation, self.config.observation_field)
        return StepResult(
            observations=[{"role": "user", "content": content}],
            reward=float(result.reward or 0.0),
            done=bool(result.done),
        )

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None


class OpenEnvToolsEnv(ToolEnv):
    def __init__(self, config: OpenEnvConfig, **kwargs: Any):
        super().__init__(**kwargs)
        self.config = config
        self.client: Any = None
        self.pending_reward = 0.0
        self.openenv_done = False

    async def _call(self, tool: str, arguments: dict[str, Any]) -> str:
        action = {"type": "call_tool", "tool_name": tool, "arguments": arguments}
        try:
            result = await self.client.step(action)
        except RuntimeError as e:  # the OpenEnv server refused this action
            raise ToolError(str(e)) from e
        except (ConnectionError, OSError) as e:
            raise ToolUnavailable(f"OpenEnv server {self.config.base_url}: {e}") from e
        self.pending_reward += float(result.reward or 0.0)
        self.openenv_done = self.openenv_done or bool(result.done)
        observation = result.observation or {}
        if observation.get("error"):
            raise ToolError(render(observation["error"].get("message", observation["error"])))
        return tool_result_text(observation.get("result"))

    def _caller(self, tool: str):
        async def call(**arguments: Any) -> str:
            return await self._call(tool, arguments)

        return call

    async def make_tools(self, task: dict[str, Any]) -> ToolGroup:
        self.client, _first = await _open_client(self.config, task)
        listed = await self.client.step({"type": "list_tools"})
        tools = []
        for spec in (listed.observation or {}).get("tools", []):
            schema = dict(spec.get("input_schema") or {"type": "object", "properties": {}})
            tools.append(
                Tool(spec["name"], spec.get("description", ""), schema, self._caller(spec["name"]))
            )
        return ToolGroup(tools)

    async def step(self, action_text: str) -> StepResult:
        self.pending_reward = 0.0
        result = await super().step(action_text)
        result.reward += self.pending_reward
        if self.openenv_done and not result.done:
            result.done = True
            result.metadata["stop_reason"] = "openenv_done"
        return result

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None


class OpenEnvProvider(EnvProvider):
    def __init__(self, config: OpenEnvConfig):
        self.config = config
        self.description = f"OpenEnv server at {config.base_url} ({config.mode} mode)"

    def make(self) -> Environment:
        if self.config.mode == "tools":
            return OpenEnvToolsEnv(self.config)
        return OpenEnvTextEnv(self.config)
