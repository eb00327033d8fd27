"""A tiny in-process calculator env following contracts.md, for measuring the tiny model.

The real env server lives in `envservers/`; this is the same rules as pure functions so the
model builder can play episodes without a server: a `<tool_call>` runs a tool and yields a
tool observation (errors become "error: ..." observations), an `<answer>X</answer>` ends the
episode with reward 1.0 when X equals the ground truth numerically, anything else ends it
with reward 0.0.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

TOOLS = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": lambda a, b: a / b,
}


def format_number(x: float) -> str:
    """Tool result text: integers without ".0"."""
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def run_tool_call(body: str) -> str:
    """Execute the JSON inside one <tool_call>; malformed input gives "error: ..."."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return f"error: tool call is not valid JSON ({e.msg})"
    if not isinstance(call, dict) or call.get("name") not in TOOLS:
        name = call.get("name") if isinstance(call, dict) else None
        return f"error: unknown tool {name!r}; available: {sorted(TOOLS)}"
    args = call.get("arguments")
    if not isinstance(args, dict) or set(args) != {"a", "b"}:
        return "error: arguments must be an object with exactly a and b"
    if not (_is_number(args["a"]) and _is_number(args["b"])):
        return "error: a and b must be numbers"
    if call["name"] == "divide" and args["b"] == 0:
        return "error: division by zero"
    return format_number(TOOLS[call["name"]](args["a"], args["b"]))


def answers_equal(answer: str, ground_truth: str) -> bool:
    try:
        x, y = float(answer.strip()), float(ground_truth)
    except ValueError:
        return False
    return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)


@dataclass
class CalculatorEpisode:
    """One episode's state; `step` takes the assistant text of one turn."""

    ground_truth: str
    must_call_tool: bool = False
    num_tool_calls: int = 0
    tool_errors: int = 0
    done: bool = False
    reward: float = 0.0
    observations: list[dict[str, str]] = field(default_factory=list)

    def step(self, action_text: str) -> list[dict[str, str]]:
        """Apply one assistant turn; returns its observation messages (empty when done)."""
        assert not self.done, "episode already finished"
        calls = _TOOL_CALL.findall(action_text)
        if calls:
            results = [run_tool_call(body.strip()) for body in calls]
            self.num_tool_calls += len(results)
            self.tool_errors += sum(r.startswith("error:") for r in results)
            self.observations = [{"role": "tool", "content": r} for r in results]
            return self.observations
        answer = _ANSWER.search(action_text)
        self.done = True
        if answer is not None and answers_equal(answer.group(1), self.ground_truth):
            self.reward = 0.0 if self.must_call_tool and self.num_tool_calls == 0 else 1.0
        self.observations = []
        return self.observations
