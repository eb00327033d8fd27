"""`noop`: one tool that does nothing and returns "ok"; episodes never end on their own.
It measures the server's own cost per step (bench/envserver.py) with no tool work in it."""

from __future__ import annotations

from typing import Any

from envservers.config import EnvServerConfig
from envservers.tool_env import ToolEnv
from envservers.tools import Tool, ToolGroup
from envservers.types import EnvProvider

NOOP_TOOLS = ToolGroup(
    [Tool("noop", "Do nothing.", {"type": "object", "properties": {}}, lambda: "ok")]
)


class NoopEnv(ToolEnv):
    async def make_tools(self, task: dict[str, Any]) -> ToolGroup:
        return NOOP_TOOLS


class NoopProvider(EnvProvider):
    description = "a no-op tool, for benchmarks and tests"

    def make(self) -> NoopEnv:
        return NoopEnv(max_turns=2**31)


def build_provider(config: EnvServerConfig) -> NoopProvider:
    return NoopProvider()
