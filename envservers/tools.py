"""Tools and tool groups: a named function, its JSON-schema parameters, and dispatch that
turns every failure (unknown tool, bad arguments, an exception inside the tool) into an
error string for the model instead of a crash.

The argument check is a small, strict subset of JSON Schema — what OpenAI-style function
specs use: `required`, `properties` with `type` (number, integer, string, boolean, array,
object, or a list of them) and `enum`, and unknown arguments refused unless the schema says
`"additionalProperties": true`. JSON booleans are not numbers.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from common.tool_parsing import ToolCall

ToolFn = Callable[..., str | Awaitable[str]]

_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def truncate_output(text: str, limit: int) -> str:
    """`text` if it has at most `limit` characters; else its head and tail around a marker
    saying how much was cut, `limit` characters at most in all (`limit` >= 64)."""
    if len(text) <= limit:
        return text
    marker = "\n[... {} of {} characters cut ...]\n"
    keep = limit - len(marker.format(len(text), len(text)))  # the widest the marker gets
    head, tail = keep - keep // 2, keep // 2
    return text[:head] + marker.format(len(text) - keep, len(text)) + text[len(text) - tail :]


class ToolError(Exception):
    """Raised by a tool for an expected failure; its message is shown to the model as is."""


class ToolUnavailable(Exception):
    """Raised by a tool whose backend is down (not the model's fault): the step fails with
    INTERNAL instead of showing the model an error it could not have avoided."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    fn: ToolFn

    def spec(self) -> dict[str, Any]:
        """The OpenAI-style function spec shown to the model."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def check_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """None if `arguments` fit `schema`, else a one-line reason naming the argument."""
    properties: dict[str, Any] = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in arguments:
            return f"missing required argument {name!r}"
    if not schema.get("additionalProperties", False):
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return f"unknown argument {unknown[0]!r} (expected {sorted(properties)})"
    for name, value in arguments.items():
        prop = properties.get(name, {})
        expected = prop.get("type")
        if expected is not None:
            types = expected if isinstance(expected, list) else [expected]
            if not any(_TYPE_CHECKS.get(t, lambda v: True)(value) for t in types):
                return f"argument {name!r} must be {' or '.join(types)}, got {value!r}"
        if "enum" in prop and value not in prop["enum"]:
            return f"argument {name!r} must be one of {prop['enum']}, got {value!r}"
    return None


class ToolGroup:
    """Tools by name, with a dispatch that never raises on bad model input."""

    def __init__(self, tools: list[Tool]):
        self.tools = {t.name: t for t in tools}
        assert len(self.tools) == len(tools), "tool names must be unique"

    def specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self.tools.values()]

    def subset(self, names: list[str]) -> ToolGroup:
        """The group of just `names`, in that order (ValueError names any unknown tool)."""
        unknown = [name for name in names if name not in self.tools]
        if unknown:
            raise ValueError(f"unknown tools {unknown}; available: {sorted(self.tools)}")
        return ToolGroup([self.tools[name] for name in names])

    async def call(self, call: ToolCall) -> tuple[str, bool]:
        """Run one call: (result text, ok). Failures give ("error: ...", False)."""
        tool = self.tools.get(call.name)
        if tool is None:
            return f"error: unknown tool {call.name!r}; available: {sorted(self.tools)}", False
        problem = check_arguments(tool.parameters, call.arguments)
        if problem is not None:
            return f"error: bad arguments for {call.name}: {problem}", False
        try:
            result = tool.fn(**call.arguments)
            if inspect.isawaitable(result):
                result = await result
        except ToolError as e:
            return f"error: {e}", False
        except ToolUnavailable:
            raise
        except Exception as e:  # untrusted input reached tool code: report, never crash
            return f"error: {call.name} failed: {type(e).__name__}: {e}", False
        return str(result), True
