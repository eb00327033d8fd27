"""`calculator`: the demo task. Four arithmetic tools; the reward is the exact answer from
`reward_spec.ground_truth` (subject to must_call_tool / tool_sequence); a row's
`extra_info.tools` may narrow the tools offered. Kept cheap: the tools
run inline on the event loop, no threads, no processes. Optionally every call first waits a
heavy-tailed latency (`[envserver.calculator]`, envservers/latency.py), for benchmarks.

Contract (the tool environments of docs/envservers.md): results print as numbers, integers
without ".0"; any failed call is an observation {"role": "tool", "content": "error: ..."}.
"""

from __future__ import annotations

import math
from typing import Any

from envservers.config import EnvServerConfig
from envservers.latency import DelayedTools, LoadStep, ToolLatency
from envservers.tool_env import ToolEnv
from envservers.tools import Tool, ToolError, ToolGroup
from envservers.types import EnvProvider

_TWO_NUMBERS = {
    "type": "object",
    "properties": {
        "a": {"type": "number", "description": "first operand"},
        "b": {"type": "number", "description": "second operand"},
    },
    "required": ["a", "b"],
}


def format_number(value: float) -> str:
    """42.0 -> "42", 2.5 -> "2.5"; ToolError for inf/nan."""
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        raise ToolError("result is not a finite number")
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def add(a: float, b: float) -> str:
    return format_number(a + b)


def subtract(a: float, b: float) -> str:
    return format_number(a - b)


def multiply(a: float, b: float) -> str:
    return format_number(a * b)


def divide(a: float, b: float) -> str:
    if b == 0:
        raise ToolError("division by zero")
    return format_number(a / b)


CALCULATOR_TOOLS = ToolGroup(
    [
        Tool("add", "Add two numbers: a + b.", _TWO_NUMBERS, add),
        Tool("subtract", "Subtract two numbers: a - b.", _TWO_NUMBERS, subtract),
        Tool("multiply", "Multiply two numbers: a * b.", _TWO_NUMBERS, multiply),
        Tool("divide", "Divide two numbers: a / b.", _TWO_NUMBERS, divide),
    ]
)


class CalculatorEnv(ToolEnv):
    def __init__(self, *, latency: ToolLatency | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.all_tools = (
            CALCULATOR_TOOLS if latency is None else DelayedTools(CALCULATOR_TOOLS, latency)
        )

    async def make_tools(self, task: dict[str, Any]) -> ToolGroup:
        # A row may offer fewer tools (`extra_info.tools`: names): a shorter prompt, and a
        # task that asks for exactly one operation.
        names = (task.get("extra_info") or {}).get("tools")
        if names is None:
            return self.all_tools  # stateless: one shared group
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ValueError("task.extra_info.tools: must be a non-empty list of tool names")
        return self.all_tools.subset(names)


class CalculatorProvider(EnvProvider):
    description = "arithmetic tools (add, subtract, multiply, divide); exact-answer reward"

    def __init__(
        self, tool_rules: dict[str, Any] | None = None, latency: ToolLatency | None = None
    ):
        self.tool_rules = tool_rules or {}  # EnvServerConfig.tool_rules
        self.latency = latency  # one seeded stream shared by every session

    def make(self) -> CalculatorEnv:
        return CalculatorEnv(latency=self.latency, **self.tool_rules)


def build_provider(config: EnvServerConfig) -> CalculatorProvider:
    slow = config.calculator
    latency = None
    if slow.latency_median_s > 0:
        step = None
        if slow.load_step_factor != 1.0:
            step = LoadStep(slow.load_step_factor, slow.load_step_after_s, slow.load_step_for_s)
        latency = ToolLatency(
            slow.latency_median_s, slow.latency_p99_s, slow.latency_seed, step=step
        )
    return CalculatorProvider(config.tool_rules, latency)
