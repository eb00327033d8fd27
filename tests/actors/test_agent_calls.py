"""actors/agent_calls.py with the demo's real tokenizer and chat template: an agent's calls
become token sequences whose generated tokens are exactly the engine's, however the agent
sends its history back; a history it rewrote is a new segment."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from actors.agent_calls import AgentCalls, CallRefused
from actors.agent_endpoint import family_tool_calls
from actors.chat import ChatTemplate
from actors.types import NO_POLICY_VERSION, Generation
from demo.tinymodel import shipped_model_dir

PROMPT = [
    {"role": "system", "content": "You are a calculator agent."},
    {"role": "user", "content": "What is 40 + 2?"},
]
ADD = {"type": "function", "function": {"name": "add", "description": "a + b",
       "parameters": {"type": "object", "properties": {"a": {}, "b": {}}}}}  # fmt: skip


@pytest.fixture(scope="module")
def chat() -> ChatTemplate:
    return ChatTemplate(AutoTokenizer.from_pretrained(shipped_model_dir()))


def _generation(chat: ChatTemplate, ids: list[int], *, version: int, eos: bool = True):
    ids = [*ids, chat.eos_token_id] if eos else list(ids)
    return Generation(
        token_ids=ids,
        logprobs=[-0.5] * len(ids),
        finish_reason="stop" if eos else "length",
        versions=[version] * len(ids),
    )


def _as_the_openai_client_sends_it(message: dict) -> dict:
    """What `response.choices[0].message.model_dump()` appended to the history holds."""
    return {**message, "refusal": None, "annotations": None, "audio": None,
            "function_call": None, "tool_calls": message.get("tool_calls")}  # fmt: skip


def test_a_continued_conversation_keeps_the_engines_tokens(chat):
    calls = AgentCalls(chat, max_input_length=4096)
    first = calls.plan(PROMPT, None)
    assert (first.index, first.prompt_ids) == (0, chat.prompt_ids(PROMPT))
    # "add" letter by letter: the engine may sample a split the tokenizer would never make.
    letters = [i for c in "add" for i in chat.tokenizer.encode(c)]
    assert chat.tokenizer.encode("add") != letters
    generated = letters + chat.tokenizer.encode(" <answer>42</answer>")
    message = calls.record(first, _generation(chat, generated, version=3), [])
    assert message == {"role": "assistant", "content": "add <answer>42</answer>"}
    follow_up = {"role": "user", "content": "And 42 + 1?"}
    history = [*PROMPT, _as_the_openai_client_sends_it(message), follow_up]
    second = calls.plan(history, None)
    segment = calls.segments[0].result
    assert second.index == 0
    assert second.prompt_ids == segment.token_ids + chat.observation_ids([follow_up])
    # Re-templating the text would have given other tokens for what the model generated.
    retemplated = chat.prompt_ids([*PROMPT, {"role": "assistant", "content": message["content"]},
                                   follow_up])  # fmt: skip
    assert retemplated != second.prompt_ids
    calls.record(second, _generation(chat, chat.tokenizer.encode("<answer>43</answer>"),
                                     version=4), [])  # fmt: skip
    assert len(calls.segments) == 1 and calls.num_calls == 2
    trained = [t for t, m in zip(segment.token_ids, segment.loss_mask, strict=True) if m]
    assert trained[: len(generated) + 1] == [*generated, chat.eos_token_id]
    assert sorted(set(segment.versions)) == [NO_POLICY_VERSION, 3, 4]
    assert segment.prompt_len == len(first.prompt_ids)


def test_tool_calls_come_back_in_any_key_order_and_the_results_extend_the_segment(chat):
    calls = AgentCalls(chat, max_input_length=4096)
    first = calls.plan(PROMPT, [ADD])
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 40, "b": 2}}\n</tool_call>'
    call = {"id": "call_0", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 40, "b": 2}'}}  # fmt: skip
    message = calls.record(first, _generation(chat, chat.tokenizer.encode(text), version=0),
                           [call])  # fmt: skip
    assert message["tool_calls"] == [call]
    sent_back = {**message, "tool_calls": [{**call, "function": {
        "name": "add", "arguments": '{"b": 2, "a": 40}'}}]}  # fmt: skip
    result = {"role": "tool", "tool_call_id": "call_0", "content": "42"}
    second = calls.plan([*PROMPT, sent_back, result], [ADD])
    assert second.index == 0
    assert second.new_ids == chat.observation_ids([result])
    # The same history with other tools offered is another conversation.
    assert calls.plan([*PROMPT, sent_back, result], None).index == 1


@pytest.mark.parametrize(
    "rewrite",
    [
        lambda m: [PROMPT[0], {"role": "user", "content": "What is 40 + 3?"}, m],  # edited ask
        lambda m: [*PROMPT, {**m, "content": "<answer>41</answer>"}],  # edited answer
        lambda m: [*PROMPT, m, {"role": "assistant", "content": "I made this up"}],  # own turn
        lambda m: [{"role": "user", "content": "Critique: is 42 right?"}],  # a second agent
    ],
)
def test_a_call_that_does_not_extend_a_segment_starts_a_new_one(chat, rewrite):
    calls = AgentCalls(chat, max_input_length=4096)
    first = calls.plan(PROMPT, None)
    message = calls.record(first, _generation(chat, chat.tokenizer.encode("<answer>42</answer>"),
                                              version=1), [])  # fmt: skip
    other = calls.plan(rewrite(message), None)
    assert other.index == 1 and other.new_ids == other.prompt_ids
    calls.record(other, _generation(chat, chat.tokenizer.encode("ok"), version=1), [])
    assert len(calls.segments) == 2
    assert calls.segments[0].result.token_ids[: len(first.prompt_ids)] == first.prompt_ids


def test_a_turn_cut_by_its_length_is_closed_with_an_eos_no_policy_made(chat):
    calls = AgentCalls(chat, max_input_length=4096)
    plan = calls.plan(PROMPT, None)
    calls.record(plan, _generation(chat, chat.tokenizer.encode("<answer>4"), version=2,
                                   eos=False), [])  # fmt: skip
    result = calls.segments[0].result
    assert result.token_ids[-1] == chat.eos_token_id
    assert (result.loss_mask[-1], result.versions[-1]) == (0, NO_POLICY_VERSION)
    assert result.turn_finish_reasons == ["length"]


def test_what_cannot_be_served_is_refused_with_a_reason(chat):
    calls = AgentCalls(chat, max_input_length=10)
    with pytest.raises(CallRefused, match=r"context too long: \d+ tokens, this rollout allows 10"):
        calls.plan(PROMPT, None)
    with pytest.raises(CallRefused, match=r"messages\[1\]: expected an object with a string"):
        calls.plan([PROMPT[0], "hello"], None)
    with pytest.raises(CallRefused, match=r"messages\[0\].content: only text parts"):
        calls.plan([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], None)
    with pytest.raises(CallRefused, match="at least one message"):
        calls.plan([], None)
    assert calls.segments == []


@pytest.mark.parametrize(
    ("tool_format", "text"),
    [
        ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 40, "b": 2}}\n</tool_call>'),
        ("llama3_json", '{"name": "add", "parameters": {"a": 40, "b": 2}}'),
        ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 40, "b": 2}}]'),
    ],
)
def test_the_familys_tool_calls_become_openai_function_calls(tool_format, text):
    (call,) = family_tool_calls(tool_format)(text)
    assert call == {"name": "add", "arguments": '{"a": 40, "b": 2}'}
    assert family_tool_calls(tool_format)("<answer>42</answer>") == []
    assert family_tool_calls("hermes")("<tool_call>\n{not json}\n</tool_call>") == []
