r"""The chat format of Tether's tiny tokenizer: Qwen2.5-style ChatML with Hermes tool calls.

    <|im_start|>system\n{system}[\n\n# Tools\n\n<tools>\n{spec per line}\n</tools>]<|im_end|>\n
    <|im_start|>user\n{text}<|im_end|>\n
    <|im_start|>assistant\n{text}<|im_end|>\n
    <|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n   (role "tool")

`CHAT_TEMPLATE` is the Jinja source saved in tokenizer_config.json (rendered by
transformers' `apply_chat_template` and by vLLM); `render_chat` is the same format written
in plain Python, kept as the obvious reference the template is tested against. Each tool
message is its own user turn, so an observation can be templated as a delta and appended
to the token history without re-tokenising it.
"""

from __future__ import annotations

import json
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
# Single tokens that still decode as text (added, not special).
TEXT_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<answer>",
    "</answer>",
)
GENERATION_PROMPT = f"{IM_START}assistant\n"

CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system_text = messages[0].content -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_text = none -%}"
    "{%- set turns = messages -%}"
    "{%- endif -%}"
    "{%- if system_text is not none or tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if system_text -%}{{- system_text -}}{%- endif -%}"
    "{%- if tools -%}"
    "{%- if system_text -%}{{- '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- if message.role == 'user' -%}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if message.content -%}{{- message.content -}}{%- endif -%}"
    "{%- if message.tool_calls -%}"
    "{%- for tool_call in message.tool_calls -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{%- if tool_call.function is defined -%}{%- set tool_call = tool_call.function -%}"
    "{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' -}}'
    "{%- if tool_call.arguments is string -%}{{- tool_call.arguments -}}"
    "{%- else -%}{{- tool_call.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content"
    " + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- raise_exception('unsupported role ' + message.role + ' (system must come first)') -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _tool_call_text(tool_call: dict[str, Any]) -> str:
    call = tool_call.get("function", tool_call)
    arguments = call["arguments"]
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f'<tool_call>\n{{"name": "{call["name"]}", "arguments": {arguments}}}\n</tool_call>'


def render_chat(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """Render `messages` in the chat format above (the reference for `CHAT_TEMPLATE`)."""
    parts: list[str] = []
    turns = messages
    system_text = None
    if messages and messages[0]["role"] == "system":
        system_text, turns = messages[0]["content"], messages[1:]
    if system_text is not None or tools:
        body = system_text or ""
        if tools:
            specs = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
            body += ("\n\n" if body else "") + f"# Tools\n\n<tools>\n{specs}\n</tools>"
        parts.append(f"{IM_START}system\n{body}{IM_END}\n")
    for message in turns:
        role = message["role"]
        if role == "user":
            parts.append(f"{IM_START}user\n{message['content']}{IM_END}\n")
        elif role == "assistant":
            content = message.get("content") or ""
            calls = [_tool_call_text(call) for call in message.get("tool_calls") or []]
            text = "\n".join(([content] if content else []) + calls)
            parts.append(f"{IM_START}assistant\n{text}{IM_END}\n")
        elif role == "tool":
            parts.append(
                f"{IM_START}user\n<tool_response>\n{message['content']}\n</tool_response>{IM_END}\n"
            )
        else:
            raise ValueError(f"unsupported role {role!r} (system must come first)")
    if add_generation_prompt:
        parts.append(GENERATION_PROMPT)
    return "".join(parts)


def observation_delta(observations: list[dict[str, Any]]) -> str:
    """Text appended after a generated assistant turn (which ends at `<|im_end|>`): the
    newline closing that turn, the observation turns, and the next generation prompt."""
    return "\n" + render_chat(observations, add_generation_prompt=True)
