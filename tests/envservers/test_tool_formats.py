"""Tool-call formats of the main open model families (common/tool_formats.py), from
their documented forms: one call, several in a message, malformed calls as errors for the
model, prose as no call."""

from __future__ import annotations

import pytest

from common.tool_formats import TOOL_FORMATS, parser_for
from common.tool_parsing import ToolCall, ToolCallError

ADD = ToolCall("add", {"a": 12, "b": 30})
LOOKUP = ToolCall("lookup", {"city": "Paris", "units": ["c", "f"]})

GOOD = {
    "hermes": (
        '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 30}}</tool_call>\n'
        '<tool_call>{"name": "lookup", "arguments": {"city": "Paris", "units": ["c", "f"]}}'
        "</tool_call>",
    ),
    "qwen3_coder": (
        "<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\n30\n"
        "</parameter>\n</function>\n</tool_call>",
        "I will add, then look up.\n<tool_call>\n<function=add>\n<parameter=a>\n12\n"
        "</parameter>\n<parameter=b>\n30\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=lookup>\n<parameter=city>\nParis\n</parameter>\n"
        '<parameter=units>\n["c", "f"]\n</parameter>\n</function>\n</tool_call>',
    ),
    "llama3_json": (
        '<|python_tag|>{"name": "add", "parameters": {"a": 12, "b": 30}}',
        '{"name": "add", "parameters": {"a": 12, "b": 30}}; '
        '{"name": "lookup", "parameters": {"city": "Paris", "units": ["c", "f"]}}',
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 12, "b": 30}}]',
        '[TOOL_CALLS]add[ARGS]{"a": 12, "b": 30}'
        '[TOOL_CALLS]lookup[ARGS]{"city": "Paris", "units": ["c", "f"]}',
    ),
}

MALFORMED = {
    "hermes": ('<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>', "not valid JSON"),
    "qwen3_coder": ("<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n", "unclosed"),
    "llama3_json": ('<|python_tag|>{"name": "add", "parameters": {"a": 1}', "not valid JSON"),
    "mistral": ('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}', "not valid JSON"),
}


def test_every_family_has_its_cases():
    assert set(GOOD) == set(MALFORMED) == set(TOOL_FORMATS)


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_one_call_and_several_calls_in_a_message(name):
    one, several = GOOD[name]
    parse = parser_for(name)
    assert parse(one) == [ADD]
    assert parse(several) == [ADD, LOOKUP]


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_a_malformed_call_is_an_error_for_the_model(name):
    text, says = MALFORMED[name]
    (call,) = parser_for(name)(text)
    assert isinstance(call, ToolCallError) and says in call.message


@pytest.mark.parametrize("name", sorted(TOOL_FORMATS))
def test_prose_and_an_answer_are_no_call(name):
    parse = parser_for(name)
    assert parse("The sum is 42. <answer>42</answer>") == []
    assert parse("{braces in prose} are not a call") == []


def test_qwen3_coder_values_are_json_where_they_read_as_json_else_text():
    text = (
        "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n<parameter=s>\nhello "
        "world\n</parameter>\n<parameter=flag>\ntrue\n</parameter>\n</function>\n</tool_call>"
    )
    assert parser_for("qwen3_coder")(text) == [
        ToolCall("f", {"n": 3, "s": "hello world", "flag": True})
    ]
    (bad,) = parser_for("qwen3_coder")("<tool_call>\nadd(1, 2)\n</tool_call>")
    assert isinstance(bad, ToolCallError) and "<function=NAME>" in bad.message


def test_llama3_json_keeps_semicolons_inside_strings():
    text = '{"name": "echo", "parameters": {"text": "a; b"}}'
    assert parser_for("llama3_json")(text) == [ToolCall("echo", {"text": "a; b"})]


def test_an_unknown_format_is_refused_with_the_supported_list():
    with pytest.raises(ValueError, match=r"unknown tool-call format 'harmony'.*'hermes'"):
        parser_for("harmony")


async def test_the_env_servers_tool_environments_read_the_configured_format():
    from envservers.config import EnvServerConfig
    from envservers.registry import build_providers
    from tests.envservers.conftest import calculator_task

    config = EnvServerConfig(envs=["calculator"], tool_format="qwen3_coder")
    env = build_providers(config)["calculator"].make()
    await env.reset(calculator_task())
    (result,) = (await env.step(GOOD["qwen3_coder"][0])).observations
    assert result == {"role": "tool", "content": "42"}
    (other,) = (await env.step(GOOD["hermes"][0])).observations  # another family's call
    assert other["content"].startswith("error: a <tool_call> needs one <function=NAME>")


def test_an_unknown_format_in_the_config_is_refused_with_the_supported_list():
    from envservers.config import EnvServerConfig

    with pytest.raises(ValueError, match=r"unknown tool-call format 'harmony'.*'llama3_json'"):
        EnvServerConfig(envs=["calculator"], tool_format="harmony")


def test_an_actor_asks_for_a_known_format_or_none():
    from actors.config import EnvConfig

    assert EnvConfig().tool_format is None  # each env server's own
    assert EnvConfig(tool_format="llama3_json").tool_format == "llama3_json"
    with pytest.raises(ValueError, match=r"unknown tool-call format 'harmony'.*'mistral'"):
        EnvConfig(tool_format="harmony")
