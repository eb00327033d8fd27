"""Untrusted model output through a real env server: every malformed tool call becomes an
error observation (never an INTERNAL error, never a dead session), a huge tool output is cut
with a visible marker, and a random-text fuzz of the parser never raises."""

import json
import math
import random

import pytest

from common.tool_parsing import ToolCall, ToolCallError, parse_tool_calls
from envservers import metrics
from envservers.tools import truncate_output
from tests.envservers.conftest import calculator_task

ADD = '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>'


def _call(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


MALFORMED = {
    "deeply nested": _call("[" * 50_000),
    "deeply nested arguments": _call('{"name": "add", "arguments": ' + "{" * 50_000),
    "a 5000-digit integer": _call('{"name": "add", "arguments": {"a": ' + "9" * 5000 + "}}"),
    "an infinite operand": _call('{"name": "add", "arguments": {"a": 1e999, "b": 1}}'),
    "a lone surrogate name": _call('{"name": "\\ud800", "arguments": {}}'),
    "a lone surrogate argument": _call('{"name": "add", "arguments": {"a": "\\udfff", "b": 1}}'),
    "NUL bytes": _call('{"name": "add\\u0000", "arguments": {"a": 1, "b": 2}}') + "\x00",
    "100 calls": ADD * 100,
    "a 60 KB name": _call(json.dumps({"name": "x" * 60_000, "arguments": {}})),
    "unknown keyword arguments": _call('{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}'),
    "a JSON list of garbage": '[{"name": 1}, {"name": null}]',
}


@pytest.mark.parametrize("action", MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_tool_calls_are_error_observations(client, action):
    session = await client.open("calculator", calculator_task())
    result = await session.step(action)
    assert not result.done and result.observations
    assert all(m["role"] == "tool" for m in result.observations)
    assert any(m["content"].startswith("error: ") for m in result.observations)
    assert result.metadata["tool_errors"] >= 1
    after = await session.step(ADD)  # the session lives on
    assert after.observations == [{"role": "tool", "content": "42"}]
    await session.close()


def test_parser_fuzz_never_raises():
    pieces = [
        "<tool_call>", "</tool_call>", "{", "}", "[", "]", '"name"', '"arguments"', ":", ",",
        '"add"', "1e999", "-0", "null", "true", '"\\ud800"', "\\", '"', "\n", "```json", "```",
        "<answer>", "</answer>", "é", "\x00", "9" * 50,
    ]  # fmt: skip
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        for call in parse_tool_calls(text):
            assert isinstance(call, ToolCall | ToolCallError)


def test_truncate_output_keeps_head_and_tail_around_a_marker():
    text = "abcdefghij" * 100  # 1000 characters, limit 60
    # The widest marker for 1000 characters, "\n[... 1000 of 1000 characters cut ...]\n",
    # has 39 characters: 21 are kept, 11 of the head and 10 of the tail; 979 are cut.
    assert truncate_output(text, 60) == (
        "abcdefghija" + "\n[... 979 of 1000 characters cut ...]\n" + "abcdefghij"
    )
    assert truncate_output(text, 1000) == text
    assert all(len(truncate_output("y" * n, 64)) <= 64 for n in (65, 999, 10**6))


async def test_a_huge_observation_is_cut_with_a_marker(client):
    # The `faulty` test env echoes the action back as its observation.
    session = await client.open("faulty", {"prompt": []})
    before = metrics.TRUNCATED_OBSERVATIONS.labels("faulty")._value.get()
    flood = "A" * 50_000 + "THE END"
    [message] = (await session.step(flood)).observations
    assert len(message["content"]) <= 16_384  # max_observation_chars, the default
    assert message["content"].startswith("AAAA") and message["content"].endswith("THE END")
    assert "of 50007 characters cut ...]" in message["content"]
    assert metrics.TRUNCATED_OBSERVATIONS.labels("faulty")._value.get() == before + 1
    await session.close()


async def test_a_non_finite_reward_is_counted_and_passed_on_for_the_actor_to_refuse(client):
    session = await client.open("faulty", {"prompt": []})
    before = metrics.NONFINITE_REWARDS.labels("faulty")._value.get()
    result = await session.step("inf-reward")
    assert result.reward == math.inf  # the actor ends the episode as error:env_reward
    assert metrics.NONFINITE_REWARDS.labels("faulty")._value.get() == before + 1
    assert (await session.step("fine")).reward == 0.5
    await session.close()
