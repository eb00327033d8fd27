"""The actors' token-delta chat rendering (actors/chat.py) against the chat templates of the
main model families (demo/family_templates.py) over Qwen's real 151k-token vocabulary: an
episode built as the actor builds it (the prompt once, each assistant turn as generated
tokens, each observation as a delta) equals the one-shot render of the whole conversation,
token for token, its loss mask covers exactly the assistant turns, and each family's tool
call is read back by the env server's parser for that format. Templates that rewrite the
history once a new user query follows are refused there with what to do, not trained on."""

from __future__ import annotations

import pytest

from actors.chat import ChatTemplate
from common.tool_formats import parser_for
from demo.family_templates import FAMILIES, family_tokenizer
from demo.qwen_vocab import RanksDownloadError, build_qwen_vocab_tokenizer
from tests.actors.family_model import episode_example

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
PROMPT = [
    {"role": "system", "content": "You are a careful calculator."},
    {"role": "user", "content": "What is 12 + 30? Use the tool."},
]
ANSWER = "12 + 30 = 42. The answer is 42."


@pytest.fixture(scope="module")
def tokenizers():
    """Qwen's vocabulary speaking each family's format, by family name."""
    from transformers import AutoTokenizer

    try:
        qwen = AutoTokenizer.from_pretrained(build_qwen_vocab_tokenizer())
    except RanksDownloadError as error:
        pytest.skip(f"no cached dashscope wheel and no PyPI: {error}")
    return {name: family_tokenizer(qwen, family) for name, family in FAMILIES.items()}


def _episode(chat: ChatTemplate, family, observations: list[list[dict]]):
    """Token ids and loss mask as the actor builds them: the prompt, then per turn the
    generated tokens (the call, then the answer; each closed by EOS) and the observation."""
    turns = [family.sample_call] + [ANSWER] * len(observations)
    ids, mask = episode_example(chat, PROMPT, TOOLS, turns, observations)
    return ids, mask, turns


def _one_shot(tokenizer, turns: list[str], observations: list[list[dict]]) -> list[int]:
    conversation = list(PROMPT)
    for i, text in enumerate(turns):
        conversation.append({"role": "assistant", "content": text})
        if i < len(observations):
            conversation += observations[i]
    text = tokenizer.apply_chat_template(conversation, tools=TOOLS, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _assistant_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    spans, current = [], []
    for token, masked in zip(ids, mask, strict=True):
        if masked:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return spans + ([current] if current else [])


TOOL_RESULT = [{"role": "tool", "content": "42"}]


@pytest.mark.parametrize("name", ["hermes", "qwen3_coder", "llama3_json", "mistral", "qwen3"])
def test_an_episode_of_deltas_equals_the_one_shot_render(tokenizers, name):
    family, tokenizer = FAMILIES[name], tokenizers[name]
    chat = ChatTemplate(tokenizer)
    observations = [TOOL_RESULT]
    ids, mask, turns = _episode(chat, family, observations)
    whole = _one_shot(tokenizer, turns, observations)
    assert whole[: len(ids)] == ids
    tail = tokenizer.decode(whole[len(ids) :], skip_special_tokens=False)
    assert tail.strip() == ""  # only what a template writes after the last EOS
    spans = _assistant_spans(ids, mask)
    assert [tokenizer.decode(span, skip_special_tokens=False) for span in spans] == [
        text + family.eos for text in turns
    ]
    assert all(token < len(tokenizer) for token in ids)  # every id decodes
    if name != "qwen3":  # qwen3 is a template, not a tool-call format of its own
        (call,) = parser_for(name)(chat.assistant_text(spans[0]))
        assert (call.name, call.arguments) == ("add", {"a": 12, "b": 30})


def test_llama_tool_results_go_to_the_ipython_role(tokenizers):
    chat = ChatTemplate(tokenizers["llama3_json"])
    delta = chat.tokenizer.decode(chat.observation_ids(TOOL_RESULT), skip_special_tokens=False)
    assert delta == (
        "<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_qwen3_coder_puts_consecutive_results_in_one_user_turn(tokenizers):
    chat = ChatTemplate(tokenizers["qwen3_coder"])
    two = [{"role": "tool", "content": "42"}, {"role": "tool", "content": "7"}]
    delta = chat.tokenizer.decode(chat.observation_ids(two), skip_special_tokens=False)
    assert delta.count("<|im_start|>user") == 1 and delta.count("<tool_response>") == 2


@pytest.mark.parametrize("name", ["mistral", "qwen3"])
def test_a_template_that_rewrites_the_history_for_a_new_query_is_refused(tokenizers, name):
    """Mistral moves the system prompt (and tools) to the newest user message; Qwen3 drops
    an earlier turn's reasoning once a new user query follows. Tool results keep both
    stable (the test above); a user-role observation is refused, saying what to do."""
    chat = ChatTemplate(tokenizers[name])
    with pytest.raises(ValueError, match="rewrites the history") as refused:
        chat.observation_ids([{"role": "user", "content": "And 5 + 5?"}])
    assert "role 'tool'" in str(refused.value)


@pytest.mark.parametrize("name", ["hermes", "qwen3_coder", "llama3_json"])
def test_stable_templates_take_a_user_role_observation_too(tokenizers, name):
    family, tokenizer = FAMILIES[name], tokenizers[name]
    observations = [[{"role": "user", "content": "And 5 + 5?"}]]
    ids, _, turns = _episode(ChatTemplate(tokenizer), family, observations)
    assert _one_shot(tokenizer, turns, observations)[: len(ids)] == ids
