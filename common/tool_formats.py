"""Tool calls in the formats of the main open model families (docs/envservers.md, "Tool-call
formats"), read out of assistant text: pure functions over strings, written from each
family's documented format (no vLLM needed). `hermes` is common/tool_parsing.py's; the
others:

    qwen3_coder   Qwen3-Coder's XML-style calls, any number per message:
                      <tool_call>
                      <function=add>
                      <parameter=a>
                      12
                      </parameter>
                      </function>
                      </tool_call>
                  A parameter's value is JSON where it reads as JSON (12, true, [1, 2]),
                  else the text itself (a string needs no quotes).
    llama3_json   Llama 3.1/3.2's JSON tool calls: {"name": ..., "parameters": {...}},
                  optionally after <|python_tag|>, several separated by ";".
    mistral       Mistral's [TOOL_CALLS] followed by a JSON list of {"name", "arguments"}
                  (tokenizer v3-v7), or by name[ARGS]{...} pairs (v11 and later).

As with hermes, a message that tries to call a tool and gets it wrong yields a
`ToolCallError` whose message is shown to the model, never an exception; a message with no
call yields []. `parser_for(name)` refuses an unknown format with the supported list.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from common.tool_parsing import (
    ToolCall,
    ToolCallError,
    _loads,
    _quote,
    _Unreadable,
    call_from_json,
    parse_tool_calls,
)
from protos.types import TOOL_FORMATS as FORMAT_NAMES
from protos.types import tool_format_problem

Parsed = list[ToolCall | ToolCallError]

_QWEN3_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_QWEN3_FUNCTION = re.compile(r"^\s*<function=([^>\n]*)>(.*?)</function>\s*$", re.DOTALL)
_QWEN3_PARAMETER = re.compile(r"<parameter=([^>\n]*)>\n?(.*?)\n?</parameter>", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL_CALLS = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"


def _parameter_value(text: str):
    try:
        return _loads(text)
    except _Unreadable:
        return text


def parse_qwen3_coder(text: str) -> Parsed:
    calls: Parsed = []
    for match in _QWEN3_CALL.finditer(text):
        if not match.group(0).endswith("</tool_call>"):
            calls.append(ToolCallError(f"unclosed <tool_call>: {_quote(match.group(1))}"))
            continue
        function = _QWEN3_FUNCTION.match(match.group(1))
        if function is None:
            calls.append(ToolCallError(
                f"a <tool_call> needs one <function=NAME>...</function>: {_quote(match.group(1))}"
            ))  # fmt: skip
            continue
        name, body = function.group(1).strip(), function.group(2)
        arguments = {k.strip(): _parameter_value(v) for k, v in _QWEN3_PARAMETER.findall(body)}
        if _QWEN3_PARAMETER.sub("", body).strip():
            calls.append(ToolCallError(f"text outside <parameter=...> in {name!r}'s call"))
            continue
        calls.append(call_from_json({"name": name, "arguments": arguments}))
    return calls


def parse_llama3_json(text: str) -> Parsed:
    stripped = text.strip()
    tagged = stripped.startswith(_PYTHON_TAG)
    if tagged:
        stripped = stripped[len(_PYTHON_TAG) :].strip()
    if not stripped.startswith("{"):
        return (
            [ToolCallError("<|python_tag|> must be followed by a JSON tool call")] if tagged else []
        )
    calls: Parsed = []
    for part in _split_top_level(stripped, ";"):
        try:
            value = _loads(part)
        except _Unreadable as e:
            if not tagged and not calls and '"name"' not in part:
                return []  # prose that starts with a brace: not an attempted call
            calls.append(ToolCallError(f"tool call is not valid JSON ({e}): {_quote(part)}"))
            continue
        calls.append(call_from_json(value))
    return calls


def parse_mistral(text: str) -> Parsed:
    start = text.find(_MISTRAL_CALLS)
    if start < 0:
        return []
    rest = text[start + len(_MISTRAL_CALLS) :].strip()
    if rest.startswith("["):
        try:
            value = _loads(rest)
        except _Unreadable as e:
            return [ToolCallError(f"[TOOL_CALLS] list is not valid JSON ({e}): {_quote(rest)}")]
        if not isinstance(value, list) or not value:
            return [ToolCallError("[TOOL_CALLS] must be followed by a non-empty JSON list")]
        return [call_from_json(v) for v in value]
    calls: Parsed = []
    for chunk in rest.split(_MISTRAL_CALLS):  # v11+: name[ARGS]{...}, repeated
        name, found, arguments = chunk.partition(_MISTRAL_ARGS)
        if not found:
            calls.append(ToolCallError(f"[TOOL_CALLS] needs NAME[ARGS]{{...}}: {_quote(chunk)}"))
            continue
        try:
            value = _loads(arguments) if arguments.strip() else {}
        except _Unreadable as e:
            calls.append(ToolCallError(f"arguments of {name.strip()!r} are not valid JSON ({e})"))
            continue
        calls.append(call_from_json({"name": name.strip(), "arguments": value}))
    return calls


def _split_top_level(text: str, separator: str) -> list[str]:
    """`text` split at `separator` outside JSON strings and brackets."""
    parts, depth, start, quoted, escaped = [], 0, 0, False, False
    for i, char in enumerate(text):
        if quoted:
            escaped, quoted = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            quoted = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


TOOL_FORMATS: dict[str, Callable[[str], Parsed]] = {
    "hermes": parse_tool_calls,
    "qwen3_coder": parse_qwen3_coder,
    "llama3_json": parse_llama3_json,
    "mistral": parse_mistral,
}


assert tuple(TOOL_FORMATS) == FORMAT_NAMES, "protos/types.py names the formats the wire carries"


def parser_for(name: str) -> Callable[[str], Parsed]:
    if problem := tool_format_problem(name):
        raise ValueError(problem)
    return TOOL_FORMATS[name]
