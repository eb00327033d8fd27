r"""Chat templates of the main open model families' tool-use formats (docs/actors.md), written
from each family's documented format, for tests over a real vocabulary (demo/qwen_vocab.py):

    hermes       Qwen2.5 / Hermes ChatML: calls as <tool_call>{json}</tool_call>, results in a
                 user turn as <tool_response>...</tool_response> (demo/chat_template.py's)
    qwen3_coder  Qwen3-Coder ChatML: calls as <tool_call><function=f><parameter=p>..., the
                 tools listed in the system turn, consecutive results in one user turn
    llama3_json  Llama 3.1 / 3.2: header-framed turns closed by <|eot_id|>, tool definitions in
                 the first user message, calls as {"name", "parameters"} JSON, results in
                 the `ipython` role
    mistral      Mistral (tokenizer v3+): [INST]...[/INST], the tools and the system prompt
                 in front of the LAST user message, calls as [TOOL_CALLS][{...}], results
                 as [TOOL_RESULTS]...[/TOOL_RESULTS]
    qwen3        Qwen3 with reasoning: ChatML that keeps an assistant turn's <think> block
                 only after the last user query and drops it from earlier turns

Each is a `Family`: its Jinja template, the special tokens it needs, its EOS (the token that
closes an assistant turn) and a sample tool call as the model writes it. `family_tokenizer`
puts one on a copy of a tokenizer (the Qwen vocabulary's, say). The actors' token-delta
rendering (actors/chat.py) is tested against each (tests/actors/test_family_templates.py):
mistral's is not prefix-stable once a user message follows (the tools and the system prompt
move to the newest user message), qwen3's once a user query follows an assistant turn that
reasoned (its <think> is dropped); both are refused there, tool results are not.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from demo.chat_template import CHAT_TEMPLATE as HERMES_TEMPLATE

_SPLIT_SYSTEM = (
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system_text = messages[0].content -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set system_text = '' -%}{%- set turns = messages -%}{%- endif -%}"
)
"""`system_text` (the leading system message's, or '') and `turns` (the messages after it)."""

_CHATML_TOOL_TURNS = (
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
)

QWEN3_CODER_TEMPLATE = (
    _SPLIT_SYSTEM + "{%- if system_text or tools -%}"
    "{{- '<|im_start|>system\\n' + system_text -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' -}}"
    "{%- for tool in tools -%}"
    "{%- set f = tool.function if tool.function is defined else tool -%}"
    "{{- '\\n<function>\\n<name>' + f.name + '</name>' -}}"
    "{%- if f.description -%}{{- '\\n<description>' + f.description + '</description>' -}}"
    "{%- endif -%}"
    "{{- '\\n<parameters>' + (f.parameters | tojson) + '</parameters>\\n</function>' -}}"
    "{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nTo call a function, reply in this format:\\n<tool_call>\\n"
    "<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n"
    "</parameter>\\n</function>\\n</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- if message.role == 'user' -%}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + message.content + '<|im_end|>\\n' -}}"
    + _CHATML_TOOL_TURNS
    + "{%- else -%}{{- raise_exception('unsupported role ' + message.role) -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if message.role in ['system', 'user'] -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- set content = message.content -%}"
    "{%- if loop.index0 < ns.last_query and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}"
    + _CHATML_TOOL_TURNS
    + "{%- else -%}{{- raise_exception('unsupported role ' + message.role) -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

LLAMA3_TEMPLATE = (
    "{{- '<|begin_of_text|>' -}}"
    + _SPLIT_SYSTEM
    + "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' -}}"
    "{%- if tools -%}{{- 'Environment: ipython\\n' -}}{%- endif -%}"
    "{{- 'Cutting Knowledge Date: December 2023\\n\\n' + system_text + '<|eot_id|>' -}}"
    "{%- set ns = namespace(tools_shown=false) -%}"
    "{%- for message in turns -%}"
    "{%- if message.role == 'user' -%}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}"
    "{%- if tools and not ns.tools_shown -%}"
    "{%- set ns.tools_shown = true -%}"
    "{{- 'Given the following functions, please respond with a JSON for a function call with "
    "its proper arguments that best answers the given prompt.\\n\\nRespond in the format "
    '{\\"name\\": function name, \\"parameters\\": dictionary of argument name and its value}.'
    " Do not use variables.\\n\\n' -}}"
    "{%- for tool in tools -%}{{- tool | tojson -}}{{- '\\n\\n' -}}{%- endfor -%}"
    "{%- endif -%}"
    "{{- message.content + '<|eot_id|>' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' + message.content -}}"
    "{{- '<|eot_id|>' -}}"
    "{%- elif message.role in ['tool', 'ipython'] -%}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' -}}"
    "{%- else -%}{{- raise_exception('unsupported role ' + message.role) -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

MISTRAL_TEMPLATE = (
    _SPLIT_SYSTEM + "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for message in turns -%}"
    "{%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{{- '<s>' -}}"
    "{%- for message in turns -%}"
    "{%- if message.role == 'user' -%}"
    "{%- if tools and loop.index0 == ns.last_user -%}"
    "{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}"
    "{%- endif -%}"
    "{%- if system_text and loop.index0 == ns.last_user -%}"
    "{{- '[INST]' + system_text + '\\n\\n' + message.content + '[/INST]' -}}"
    "{%- else -%}{{- '[INST]' + message.content + '[/INST]' -}}{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}{{- message.content + '</s>' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '[TOOL_RESULTS]' + ({'content': message.content} | tojson) + '[/TOOL_RESULTS]' -}}"
    "{%- else -%}{{- raise_exception('unsupported role ' + message.role) -}}{%- endif -%}"
    "{%- endfor -%}"
)


@dataclass(frozen=True)
class Family:
    """One family's chat format: template, special tokens, EOS, and a call as written."""

    name: str
    template: str
    special_tokens: tuple[str, ...]
    eos: str
    sample_call: str
    """`add(a=12, b=30)` as the family's models write it (before the EOS)."""
    text_tokens: tuple[str, ...] = ()
    """Single tokens that decode as text."""


_CHATML = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CHATML_TEXT = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
FAMILIES = {
    family.name: family
    for family in (
        Family(
            "hermes", HERMES_TEMPLATE, _CHATML, "<|im_end|>",
            '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>',
            _CHATML_TEXT,
        ),
        Family(
            "qwen3_coder", QWEN3_CODER_TEMPLATE, _CHATML, "<|im_end|>",
            "<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\n30\n"
            "</parameter>\n</function>\n</tool_call>",
            _CHATML_TEXT,
        ),
        Family(
            "llama3_json", LLAMA3_TEMPLATE,
            ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
             "<|eom_id|>", "<|python_tag|>"),
            "<|eot_id|>", '{"name": "add", "parameters": {"a": 12, "b": 30}}',
        ),
        Family(
            "mistral", MISTRAL_TEMPLATE,
            ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
             "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
            "</s>", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 12, "b": 30}}]',
        ),
        Family(
            "qwen3", QWEN3_TEMPLATE, _CHATML, "<|im_end|>",
            '<think>\nI add them.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": '
            '{"a": 12, "b": 30}}\n</tool_call>',
            _CHATML_TEXT + ("<think>", "</think>"),
        ),
    )
}  # fmt: skip
"""By name; each tool-call format of protos.types.TOOL_FORMATS has one, and `qwen3` shows a
template that rewrites earlier turns."""


def family_tokenizer(tokenizer, family: Family):
    """A copy of `tokenizer` (a transformers fast tokenizer) speaking `family`'s format: its
    special and text tokens added (after the vocabulary, as new ids), its template and EOS."""
    from tokenizers import AddedToken

    out = copy.deepcopy(tokenizer)
    out.add_special_tokens(
        {
            "additional_special_tokens": [
                AddedToken(t, special=True, normalized=False) for t in family.special_tokens
            ]
        }  # fmt: skip
    )
    out.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.text_tokens])
    out.eos_token = family.eos
    out.chat_template = family.template
    return out
