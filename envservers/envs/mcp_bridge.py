"""`mcp`: a bridge to MCP servers. The configured servers are started over stdio with the
`mcp` SDK when the env server starts, and their tools become this environment's tools
(specs from the servers' `tools/list`, calls through `tools/call`). All sessions share the
server processes. Reward: the final `<answer>` against `reward_spec.ground_truth` (subject
to must_call_tool / tool_sequence — the shape our users' MCP datasets use).

    [envserver.mcp.servers.time]
    command = "python"                       # = the env server's own interpreter
    args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]

A tool result with isError, an MCP error reply (unknown tool, bad params) or a timeout is an
error observation; a server that died makes the step fail with INTERNAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from typing import Any

from envservers.config import EnvServerConfig, McpConfig, McpServerConfig
from envservers.tool_env import ToolEnv
from envservers.tools import Tool, ToolError, ToolGroup, ToolUnavailable
from envservers.types import EnvProvider

log = logging.getLogger(__name__)


def content_text(content: list[Any]) -> str:
    """MCP content blocks as the text the model sees."""
    parts = []
    for block in content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')}]")
    return "\n".join(parts)


class McpServer:
    """One MCP server process and its client session, owned by one task (the SDK's context
    managers must be entered and left in the same task)."""

    def __init__(self, name: str, config: McpServerConfig, tool_timeout_s: float):
        self.name = name
        self.config = config
        self.tool_timeout_s = tool_timeout_s
        self.session: Any = None
        self.tools: list[Any] = []
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._error: BaseException | None = None

    async def _own(self) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        command = sys.executable if self.config.command == "python" else self.config.command
        params = StdioServerParameters(
            command=command,
            args=self.config.args,
            env=self.config.env or None,
            cwd=self.config.cwd,
        )
        try:
            async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                self.tools = (await s.list_tools()).tools
                self.session = s
                self._ready.set()
                await self._stop.wait()
        except Exception as e:  # the server failed to start or died: callers are told
            self._error = e
            log.error("MCP server %s stopped: %s", self.name, e)
        finally:
            self.session = None
            self._ready.set()

    async def start(self, timeout_s: float) -> None:
        self._task = asyncio.create_task(self._own(), name=f"mcp-{self.name}")
        try:
            async with asyncio.timeout(timeout_s):
                await self._ready.wait()
        except TimeoutError:
            await self.stop()
            raise ValueError(f"MCP server {self.name!r} did not start in {timeout_s}s") from None
        if self.session is None:
            raise ValueError(f"MCP server {self.name!r} failed to start: {self._error}")

    async def call(self, tool: str, arguments: dict[str, Any]) -> str:
        from mcp import MCPError

        if self.session is None:
            raise ToolUnavailable(f"MCP server {self.name!r} is not running: {self._error}")
        try:
            async with asyncio.timeout(self.tool_timeout_s):
                result = await self.session.call_tool(tool, arguments)
        except TimeoutError:
            raise ToolError(f"{tool} timed out after {self.tool_timeout_s}s") from None
        except MCPError as e:
            raise ToolError(f"{tool}: {e}") from None
        text = content_text(result.content)
        if result.is_error:
            raise ToolError(text)
        return text

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class McpProvider(EnvProvider):
    description = "tools of configured MCP servers (stdio), via the mcp SDK"

    def __init__(self, config: McpConfig, tool_rules: dict[str, Any] | None = None):
        self.config = config
        self.tool_rules = tool_rules or {}  # EnvServerConfig.tool_rules
        self.servers = {
            name: McpServer(name, c, config.tool_timeout_s) for name, c in config.servers.items()
        }
        self.tools: ToolGroup | None = None

    async def start(self) -> None:
        try:
            await asyncio.gather(
                *(s.start(self.config.startup_timeout_s) for s in self.servers.values())
            )
        except BaseException:
            await self.stop()
            raise
        tools, owner = [], {}
        for server in self.servers.values():
            for t in server.tools:
                if t.name in owner:
                    raise ValueError(
                        f"MCP tool {t.name!r} offered by {owner[t.name]!r} and "
                        f"{server.name!r}; tool names must be unique"
                    )
                owner[t.name] = server.name
                tools.append(
                    Tool(
                        t.name,
                        t.description or "",
                        dict(t.input_schema),
                        self._caller(server, t.name),
                    )
                )
        self.tools = ToolGroup(tools)

    @staticmethod
    def _caller(server: McpServer, tool: str):
        async def call(**arguments: Any) -> str:
            return await server.call(tool, arguments)

        return call

    def make(self) -> McpEnv:
        assert self.tools is not None, "make before start"
        return McpEnv(self.tools, **self.tool_rules)

    async def stop(self) -> None:
        for server in self.servers.values():
            await server.stop()


class McpEnv(ToolEnv):
    def __init__(self, tools: ToolGroup, **kwargs: Any):
        super().__init__(**kwargs)
        self.shared_tools = tools

    async def make_tools(self, task: dict[str, Any]) -> ToolGroup:
        return self.shared_tools


def build_provider(config: EnvServerConfig) -> McpProvider:
    return McpProvider(config.mcp, config.tool_rules)
