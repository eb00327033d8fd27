"""Reward rules from reward_spec and the tool argument checks, on hand-worked cases."""

import pytest

from common.tool_parsing import ToolCall
from envservers import rewards
from envservers.tools import Tool, ToolError, ToolGroup, check_arguments


def _score(answer, spec, calls=()):
    return rewards.score(answer, rewards.rules_from_spec(spec), list(calls))


@pytest.mark.parametrize(
    "answer, truth, expected",
    [
        ("42", "42", 1.0),
        ("42.0", "42", 1.0),
        (" 42 ", 42, 1.0),
        ("1,000", "1000", 1.0),
        ("0.1", "0.10000000000000001", 1.0),
        ("41", "42", 0.0),
        ("forty-two", "42", 0.0),
        ("Paris", "Paris", 1.0),
        ("paris", "Paris", 0.0),
    ],
)
def test_exact_answer(answer, truth, expected):
    assert _score(answer, {"ground_truth": truth}) == expected


def test_no_answer_scores_zero_even_without_ground_truth():
    assert _score(None, {}) == 0.0
    assert _score("anything", {}) == 1.0


def test_must_call_tool_bool_counts_only_successful_calls():
    spec = {"ground_truth": "42", "must_call_tool": True}
    assert _score("42", spec, []) == 0.0
    assert _score("42", spec, ["add"]) == 1.0


def test_must_call_tool_by_name_nested_skyrl_shape():
    spec = {"ground_truth": {"answer": "42", "success": {"must_call_tool": "add"}}}
    assert _score("42", spec, ["multiply"]) == 0.0
    assert _score("42", spec, ["multiply", "add"]) == 1.0
    assert _score("41", spec, ["add"]) == 0.0


def test_tool_sequence_is_an_ordered_subsequence():
    spec = {"ground_truth": "42", "tool_sequence": ["add", "multiply"]}
    assert _score("42", spec, ["add", "multiply"]) == 1.0
    assert _score("42", spec, ["add", "divide", "multiply"]) == 1.0
    assert _score("42", spec, ["multiply", "add"]) == 0.0
    assert _score("42", spec, ["add"]) == 0.0


def test_tool_sequence_of_dicts_from_mcp_datasets():
    step = {"step": 1, "server": "time", "tool": "convert_time"}
    spec = {"ground_truth": {"tool_sequence": [step]}}
    assert _score("done", spec, ["convert_time"]) == 1.0
    assert _score("done", spec, []) == 0.0


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"ground_truth": [1, 2]}, "ground_truth"),
        ({"must_call_tool": 3}, "must_call_tool"),
        ({"tool_sequence": "add"}, "tool_sequence"),
        ({"tool_sequence": [{"step": 1}]}, "tool_sequence"),
    ],
)
def test_unusable_specs_name_the_field(spec, field):
    with pytest.raises(ValueError, match=field):
        rewards.rules_from_spec(spec)


def test_is_subsequence_limits():
    assert rewards.is_subsequence((), [])
    assert not rewards.is_subsequence(("a",), [])
    assert rewards.is_subsequence(("a", "a"), ["a", "b", "a"])
    assert not rewards.is_subsequence(("a", "a"), ["a", "b"])


NUMBERS = {
    "type": "object",
    "properties": {"a": {"type": "number"}, "n": {"type": "integer"}, "m": {"enum": ["x", "y"]}},
    "required": ["a"],
}


@pytest.mark.parametrize(
    "arguments, problem",
    [
        ({"a": 1}, None),
        ({"a": 1.5, "n": 3, "m": "x"}, None),
        ({}, "missing required argument 'a'"),
        ({"a": "1"}, "argument 'a' must be number, got '1'"),
        ({"a": True}, "argument 'a' must be number, got True"),
        ({"a": 1, "n": 2.5}, "argument 'n' must be integer, got 2.5"),
        ({"a": 1, "m": "z"}, "argument 'm' must be one of ['x', 'y'], got 'z'"),
        ({"a": 1, "c": 2}, "unknown argument 'c' (expected ['a', 'm', 'n'])"),
    ],
)
def test_check_arguments(arguments, problem):
    assert check_arguments(NUMBERS, arguments) == problem


async def test_tool_group_turns_every_failure_into_an_error_string():
    def boom():
        raise KeyError("inner")

    def refuse():
        raise ToolError("not today")

    async def later(x: int) -> str:
        return str(x * 2)

    empty = {"type": "object", "properties": {}}
    group = ToolGroup(
        [
            Tool("boom", "", empty, boom),
            Tool("refuse", "", empty, refuse),
            Tool("later", "", {"type": "object", "properties": {"x": {"type": "integer"}}}, later),
        ]
    )
    assert await group.call(ToolCall("later", {"x": 21})) == ("42", True)
    assert await group.call(ToolCall("refuse")) == ("error: not today", False)
    text, ok = await group.call(ToolCall("boom"))
    assert not ok and text.startswith("error: boom failed: KeyError")
    text, ok = await group.call(ToolCall("nope"))
    assert not ok and "unknown tool 'nope'" in text
    text, ok = await group.call(ToolCall("later", {"x": "21"}))
    assert not ok and "bad arguments for later" in text
