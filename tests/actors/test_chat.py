"""Observation deltas: appending them token by token must give exactly the chat template's
rendering of the whole conversation (the slow obvious way), with nothing re-tokenised."""

from __future__ import annotations

import pytest

from actors.chat import ChatTemplate
from demo.chat_template import observation_delta, render_chat
from demo.data import DEMO_TOOLS, SYSTEM_PROMPT
from demo.tokenizer import build_tokenizer

PROMPT = [
    {"role": "system", "content": SYSTEM_PROMPT},
    {"role": "user", "content": "What is 17 + 25?"},
]
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(num_conversations=200)


@pytest.fixture(scope="module")
def chat(tokenizer):
    return ChatTemplate(tokenizer)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_prompt_is_the_templated_prompt_with_generation_prompt(tokenizer, chat):
    ids = chat.prompt_ids(PROMPT, DEMO_TOOLS)
    expected = render_chat(PROMPT, tools=DEMO_TOOLS, add_generation_prompt=True)
    assert tokenizer.decode(ids) == expected
    assert ids == _encode(tokenizer, expected)
    assert tokenizer.decode(ids).endswith("<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "observations",
    [
        [{"role": "tool", "content": "42"}],
        [{"role": "tool", "content": "42"}, {"role": "tool", "content": "error: bad args"}],
        [{"role": "user", "content": "Try again."}],
        [{"role": "tool", "content": ""}],
    ],
)
def test_observation_delta_is_the_text_the_template_puts_after_eos(tokenizer, chat, observations):
    delta = chat.observation_ids(observations)
    assert tokenizer.decode(delta) == observation_delta(observations)
    assert delta == _encode(tokenizer, observation_delta(observations))


def test_appended_deltas_equal_the_whole_conversation_rendered_once(tokenizer, chat):
    turns = [TOOL_CALL, "<answer>42</answer>"]
    observation = [{"role": "tool", "content": "42"}]
    eos = [tokenizer.eos_token_id]
    ids = chat.prompt_ids(PROMPT, DEMO_TOOLS)
    ids += _encode(tokenizer, turns[0]) + eos
    ids += chat.observation_ids(observation)
    ids += _encode(tokenizer, turns[1]) + eos

    conversation = PROMPT + [
        {"role": "assistant", "content": turns[0]},
        *observation,
        {"role": "assistant", "content": turns[1]},
    ]
    full = render_chat(conversation, tools=DEMO_TOOLS)  # ends "<|im_end|>\n"
    assert tokenizer.decode(ids) + "\n" == full
    assert ids + _encode(tokenizer, "\n") == _encode(tokenizer, full)


def test_assistant_text_drops_only_the_closing_eos(tokenizer, chat):
    ids = _encode(tokenizer, TOOL_CALL) + [tokenizer.eos_token_id]
    assert chat.assistant_text(ids) == TOOL_CALL
    cut = _encode(tokenizer, TOOL_CALL)[:5]  # stopped on length: no EOS to drop
    assert chat.assistant_text(cut) == tokenizer.decode(cut)
    assert chat.assistant_text([]) == ""


def test_malformed_messages_are_rejected_with_a_reason(chat):
    with pytest.raises(ValueError, match="string 'content'"):
        chat.observation_ids([{"role": "tool", "content": 42}])
    with pytest.raises(ValueError, match="must be a list"):
        chat.observation_ids({"role": "tool", "content": "42"})
    with pytest.raises(ValueError, match="no messages"):
        chat.prompt_ids([])


def test_templates_that_rewrite_history_are_refused(tokenizer):
    # A template whose first line depends on the number of messages: the history's tokens
    # would change when an observation is appended, so deltas cannot be used.
    unstable = tokenizer.chat_template.replace(
        "{{- '<|im_start|>system\\n' -}}",
        "{{- '<|im_start|>system\\n' + (messages | length | string) -}}",
    )
    assert unstable != tokenizer.chat_template
    old = tokenizer.chat_template
    tokenizer.chat_template = unstable
    try:
        with pytest.raises(ValueError, match="renders earlier turns differently"):
            ChatTemplate(tokenizer).observation_ids([{"role": "tool", "content": "1"}])
    finally:
        tokenizer.chat_template = old


def test_tokenizer_without_chat_template_is_refused(tokenizer):
    old = tokenizer.chat_template
    tokenizer.chat_template = None
    try:
        with pytest.raises(ValueError, match="chat_template"):
            ChatTemplate(tokenizer)
    finally:
        tokenizer.chat_template = old


def test_a_repeated_prompt_gives_the_same_ids_and_a_caller_cannot_change_them(chat):
    first = chat.prompt_ids(PROMPT, DEMO_TOOLS)
    first.append(-1)  # a caller extending its sequence in place
    assert chat.prompt_ids(PROMPT, DEMO_TOOLS) == first[:-1]
    assert chat.prompt_ids(PROMPT) != first[:-1]  # other tools, another prompt
