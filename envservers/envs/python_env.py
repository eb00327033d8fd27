"""`python`: the model runs Python code in a sandbox (envservers/sandbox.py) through the
tool `run_python(code)`; files it writes stay in the session's scratch dir across steps.
The tool result is the program's output (stdout and stderr, capped); a non-zero exit, a
kill or a timeout is an error observation. Reward: the final `<answer>` against
`reward_spec.ground_truth` (subject to must_call_tool / tool_sequence).
"""

from __future__ import annotations

import os
from typing import Any

from envservers.config import EnvServerConfig, SandboxConfig
from envservers.sandbox import Sandbox
from envservers.tool_env import ToolEnv
from envservers.tools import Tool, ToolError, ToolGroup
from envservers.types import EnvProvider

_CODE = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "a Python 3 program"}},
    "required": ["code"],
}


class PythonEnv(ToolEnv):
    def __init__(self, config: SandboxConfig, **kwargs: Any):
        super().__init__(**kwargs)
        self.config = config
        self.sandbox: Sandbox | None = None

    async def run_python(self, code: str) -> str:
        assert self.sandbox is not None
        result = await self.sandbox.run(code)
        if result.killed == "timeout":
            raise ToolError(
                f"killed after {self.config.timeout_s}s (wall-clock limit)\n" + result.output
            )
        if result.killed:
            raise ToolError(f"killed: {result.killed}\n{result.output}")
        if result.exit_code != 0:
            raise ToolError(f"exit code {result.exit_code}\n{result.output}")
        return result.output

    async def make_tools(self, task: dict[str, Any]) -> ToolGroup:
        self.sandbox = Sandbox(self.config)
        return ToolGroup(
            [
                Tool(
                    "run_python",
                    "Run a Python program; returns its output.",
                    _CODE,
                    self.run_python,
                )
            ]
        )

    async def close(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.close()
            self.sandbox = None


class PythonProvider(EnvProvider):
    description = "runs model-written Python in a sandbox (no network, scratch dir only)"

    def __init__(self, config: EnvServerConfig):
        self.config = config

    async def start(self) -> None:
        """Refuse to serve when the configured isolation cannot be had here."""
        if self.config.python.isolation == "namespaces" and os.getuid() != 0:
            raise ValueError(
                "python env: isolation 'namespaces' needs root; set "
                "envserver.python.isolation=rlimits for the weak sandbox"
            )
        sandbox = Sandbox(self.config.python)
        try:
            result = await sandbox.run("print(6 * 7)")
        finally:
            await sandbox.close()
        if result.output.strip() != "42":
            raise ValueError(f"python env: the sandbox does not work here: {result.output!r}")

    def make(self) -> PythonEnv:
        return PythonEnv(self.config.python, **self.config.tool_rules)


def build_provider(config: EnvServerConfig) -> PythonProvider:
    return PythonProvider(config)
