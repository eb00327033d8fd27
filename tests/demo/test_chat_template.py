"""The chat template renders exactly the format written at the top of demo/chat_template.py
(docs/tinymodel.md, "Chat format"): the Jinja source and the Python reference agree."""

import pytest

from demo.chat_template import CHAT_TEMPLATE, observation_delta, render_chat

ADD_SPEC = {
    "type": "function",
    "function": {"name": "add", "description": "Add.", "parameters": {"type": "object"}},
}
ADD_SPEC_LINE = (
    '{"type": "function", "function": {"name": "add", "description": "Add.", '
    '"parameters": {"type": "object"}}}'
)
CONVERSATION = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What is 17 + 25?"},
    {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>',
    },
    {"role": "tool", "content": "42"},
    {"role": "assistant", "content": "<answer>42</answer>"},
]
EXPECTED = (
    "<|im_start|>system\nYou are helpful.\n\n# Tools\n\n<tools>\n"
    + ADD_SPEC_LINE
    + "\n</tools><|im_end|>\n"
    "<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n<answer>42</answer><|im_end|>\n"
)


def _jinja(tokenizer, messages, tools=None, add_generation_prompt=False):
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
    )


def test_reference_renders_contract_format():
    assert render_chat(CONVERSATION, tools=[ADD_SPEC]) == EXPECTED


def test_jinja_template_renders_contract_format(tiny_tokenizer):
    assert tiny_tokenizer.chat_template == CHAT_TEMPLATE
    assert _jinja(tiny_tokenizer, CONVERSATION, tools=[ADD_SPEC]) == EXPECTED


def test_generation_prompt_and_no_tools(tiny_tokenizer):
    messages = CONVERSATION[:2]
    expected = (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _jinja(tiny_tokenizer, messages, add_generation_prompt=True) == expected
    assert render_chat(messages, add_generation_prompt=True) == expected


@pytest.mark.parametrize(
    "messages, tools",
    [
        ([{"role": "user", "content": "hi"}], None),  # no system turn at all
        ([{"role": "user", "content": "hi"}], [ADD_SPEC, ADD_SPEC]),  # tools, no system text
        (CONVERSATION, None),
        (
            [  # OpenAI-style tool_calls, arguments as a dict and as a JSON string
                {"role": "user", "content": "sum"},
                {
                    "role": "assistant",
                    "content": "Let me add.",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}},
                        {"function": {"name": "add", "arguments": '{"b": 2}'}},
                    ],
                },
                {"role": "tool", "content": "3"},
                {"role": "tool", "content": "error: x"},
            ],
            [ADD_SPEC],
        ),
    ],
)
def test_jinja_equals_reference(tiny_tokenizer, messages, tools):
    for add_generation_prompt in (False, True):
        assert _jinja(tiny_tokenizer, messages, tools, add_generation_prompt) == render_chat(
            messages, tools, add_generation_prompt
        )


def test_tool_calls_field_renders_hermes_block():
    messages = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "add", "arguments": {"a": 12, "b": 30}}}],
        }
    ]
    assert render_chat(messages) == (
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n'
        "</tool_call><|im_end|>\n"
    )


def test_observation_delta_extends_history():
    # History ends at the generated <|im_end|>; delta + history == the full rendering.
    history = render_chat(CONVERSATION[:3], tools=[ADD_SPEC]).removesuffix("\n")
    delta = observation_delta([{"role": "tool", "content": "42"}])
    assert delta == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert history + delta == render_chat(
        CONVERSATION[:4], tools=[ADD_SPEC], add_generation_prompt=True
    )


def test_system_after_first_turn_is_rejected():
    with pytest.raises(ValueError, match="system must come first"):
        render_chat([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])
