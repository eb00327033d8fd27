"""The tool-call parser on well-formed and many malformed assistant messages."""

import pytest

from common.tool_parsing import ToolCall, ToolCallError, extract_tag, parse_tool_calls

ADD = ToolCall("add", {"a": 12, "b": 30})


def test_contract_form():
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>'
    assert parse_tool_calls(text) == [ADD]


def test_several_blocks_with_prose_keep_order():
    text = (
        'Let me compute. <tool_call>{"name": "add", "arguments": {"a": 12, "b": 30}}</tool_call>'
        ' and <tool_call>{"name": "divide", "arguments": {"a": 1, "b": 2}}</tool_call> done'
    )
    assert parse_tool_calls(text) == [ADD, ToolCall("divide", {"a": 1, "b": 2})]


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "add", "arguments": {"a": 12, "b": 30}}',
        '  {"name": "add", "arguments": {"a": 12, "b": 30}}\n',
        '```json\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n```',
        '{"name": "add", "arguments": "{\\"a\\": 12, \\"b\\": 30}"}',  # OpenAI string form
        '{"name": "add", "parameters": {"a": 12, "b": 30}}',
        '<tool_call>{"name": " add ", "arguments": {"a": 12, "b": 30}}</tool_call>',
    ],
)
def test_accepted_variants(text):
    assert parse_tool_calls(text) == [ADD]


def test_plain_json_list():
    text = '[{"name": "add", "arguments": {"a": 12, "b": 30}}, {"name": "noop"}]'
    assert parse_tool_calls(text) == [ADD, ToolCall("noop", {})]


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 42.",
        "",
        "[1, 2, 3]",
        '{"answer": 42}',
        "{not json at all",
        "</tool_call> stray closing tag",
        "<answer>42</answer>",
    ],
)
def test_no_call(text):
    assert parse_tool_calls(text) == []


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("<tool_call></tool_call>", "empty <tool_call>"),
        ("<tool_call>   \n </tool_call>", "empty <tool_call>"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>', "not valid JSON"),
        ("<tool_call>{'name': 'add'}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1}', "unclosed <tool_call>"),
        ('<tool_call>["add", 1, 2]</tool_call>', "must be a JSON object, got list"),
        ('<tool_call>"add"</tool_call>', "must be a JSON object, got str"),
        ('<tool_call>{"arguments": {"a": 1}}</tool_call>', 'needs a "name"'),
        ('<tool_call>{"name": 7}</tool_call>', 'needs a "name"'),
        ('<tool_call>{"name": ""}</tool_call>', 'needs a "name"'),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "add", "arguments": 5}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "add", "arguments": "{oops"}</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "add", "arguments": "[1]"}</tool_call>', "must be a JSON object"),
        ('{"name": "add", "arguments": 3}', "must be a JSON object"),
    ],
)
def test_malformed_calls_become_errors(text, fragment):
    [result] = parse_tool_calls(text)
    assert isinstance(result, ToolCallError)
    assert fragment in result.message


def test_nested_open_tag_reports_and_recovers():
    text = (
        '<tool_call>{"name": "add", <tool_call>{"name": "add", "arguments": '
        '{"a": 12, "b": 30}}</tool_call>'
    )
    first, second = parse_tool_calls(text)
    assert isinstance(first, ToolCallError) and "opened twice" in first.message
    assert second == ADD


def test_good_call_then_unclosed():
    text = '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 30}}</tool_call><tool_call>{'
    first, second = parse_tool_calls(text)
    assert first == ADD
    assert isinstance(second, ToolCallError) and "unclosed" in second.message


def test_error_quotes_are_capped():
    [error] = parse_tool_calls("<tool_call>" + "x" * 10_000 + "</tool_call>")
    assert len(error.message) < 300


def test_null_arguments_mean_none():
    assert parse_tool_calls('<tool_call>{"name": "noop", "arguments": null}</tool_call>') == [
        ToolCall("noop", {})
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>42</answer>", "42"),
        ("so <answer> 42 \n</answer> done", "42"),
        ("<answer>1</answer> no wait <answer>2</answer>", "2"),
        ("<answer>42", None),
        ("42</answer>", None),
        ("no answer", None),
        ("<answer></answer>", ""),
    ],
)
def test_extract_answer(text, expected):
    assert extract_tag(text, "answer") == expected
