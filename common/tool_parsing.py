"""Parse tool calls and final answers out of assistant text. Pure functions over strings.

Accepted tool-call forms (Hermes / Qwen2.5 style, what our chat template teaches):

    <tool_call>
    {"name": "add", "arguments": {"a": 12, "b": 30}}
    </tool_call>

any number of such blocks in one message, or — when the message has no `<tool_call>` tag —
the whole message as one plain JSON object with "name" and "arguments" (optionally inside a
```json fence), or a JSON list of such objects. "arguments" may also be a JSON-encoded string
(OpenAI's wire form) and "parameters" is accepted as its alias.

The model's text is untrusted: every malformed block becomes a `ToolCallError` carrying a
message meant for the model (it is shown to it as an error observation), never an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.DOTALL)
_MAX_ECHO = 80  # characters of the offending text quoted back in an error


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallError:
    """A block that looked like a tool call but could not be read."""

    message: str


def _quote(text: str) -> str:
    text = text.strip()
    return repr(text if len(text) <= _MAX_ECHO else text[:_MAX_ECHO] + "...")


class _Unreadable(Exception):
    """JSON that cannot be read: malformed, nested too deeply, or a too long integer."""


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _Unreadable(f"{e.msg} at char {e.pos}") from None
    except RecursionError:
        raise _Unreadable("nested too deeply") from None
    except ValueError as e:  # e.g. an integer beyond Python's 4300-digit conversion limit
        raise _Unreadable(str(e).split(";")[0]) from None


def call_from_json(value: Any) -> ToolCall | ToolCallError:
    """Turn one decoded JSON value into a ToolCall, or say what is wrong with it."""
    if not isinstance(value, dict):
        return ToolCallError(f"tool call must be a JSON object, got {type(value).__name__}")
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallError('tool call needs a "name" string')
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = _loads(arguments) if arguments.strip() else {}
        except _Unreadable as e:
            return ToolCallError(f'"arguments" of {name!r} is a string but not valid JSON: {e}')
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCallError(f'"arguments" of {name!r} must be a JSON object')
    return ToolCall(name=name.strip(), arguments=arguments)


def _parse_block(body: str) -> ToolCall | ToolCallError:
    if not body.strip():
        return ToolCallError("empty <tool_call> block")
    try:
        value = _loads(body)
    except _Unreadable as e:
        return ToolCallError(f"tool call is not valid JSON ({e}): {_quote(body)}")
    return call_from_json(value)


def _parse_tagged(text: str) -> list[ToolCall | ToolCallError]:
    calls: list[ToolCall | ToolCallError] = []
    position = 0
    while True:
        start = text.find(OPEN_TAG, position)
        if start < 0:
            return calls
        body_start = start + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, body_start)
        nested = text.find(OPEN_TAG, body_start)
        if end < 0:
            calls.append(ToolCallError(f"unclosed <tool_call>: {_quote(text[body_start:])}"))
            return calls
        if 0 <= nested < end:
            calls.append(ToolCallError("<tool_call> opened twice before </tool_call>"))
            position = nested
            continue
        calls.append(_parse_block(text[body_start:end]))
        position = end + len(CLOSE_TAG)


def _parse_plain_json(text: str) -> list[ToolCall | ToolCallError]:
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    if not stripped or stripped[0] not in "[{":
        return []
    try:
        value = _loads(stripped)
    except _Unreadable:
        return []  # prose that merely starts with a bracket: not an attempted call
    if isinstance(value, dict) and "name" in value:
        return [call_from_json(value)]
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, dict) and "name" in v for v in value)
    ):
        return [call_from_json(v) for v in value]
    return []


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
    """All tool calls in an assistant message, in order; [] if it makes none."""
    if OPEN_TAG in text:
        return _parse_tagged(text)
    return _parse_plain_json(text)


def extract_tag(text: str, tag: str) -> str | None:
    """The stripped content of the last `<tag>...</tag>` in text, or None if there is none."""
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    end = text.rfind(close_tag)
    if end < 0:
        return None
    start = text.rfind(open_tag, 0, end)
    if start < 0:
        return None
    return text[start + len(open_tag) : end].strip()
