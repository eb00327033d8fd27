"""The in-process calculator follows contracts.md."""

import pytest

from demo.calculator import CalculatorEpisode, answers_equal, format_number, run_tool_call


@pytest.mark.parametrize(
    "body, result",
    [
        ('{"name": "add", "arguments": {"a": 12, "b": 30}}', "42"),
        ('{"name": "subtract", "arguments": {"a": 5, "b": 7.5}}', "-2.5"),
        ('{"name": "multiply", "arguments": {"a": 2.5, "b": 4}}', "10"),
        ('{"name": "divide", "arguments": {"a": 1, "b": 4}}', "0.25"),
        ('{"name": "divide", "arguments": {"a": 1, "b": 0}}', "error: division by zero"),
        (
            '{"name": "pow", "arguments": {"a": 1, "b": 2}}',
            "error: unknown tool 'pow'; available: ['add', 'divide', 'multiply', 'subtract']",
        ),
        (
            '{"name": "add", "arguments": {"a": 1}}',
            "error: arguments must be an object with exactly a and b",
        ),
        ('{"name": "add", "arguments": {"a": "1", "b": 2}}', "error: a and b must be numbers"),
        ('{"name": "add", "arguments": {"a": true, "b": 2}}', "error: a and b must be numbers"),
    ],
)
def test_run_tool_call(body, result):
    assert run_tool_call(body) == result


def test_malformed_json_is_an_error_observation():
    assert run_tool_call('{"name": "add", "arguments": {"a": 030}}').startswith("error: ")
    assert run_tool_call("[1, 2]").startswith("error: unknown tool")


def test_format_number():
    assert [format_number(x) for x in (42, 42.0, -3.0, 0.5)] == ["42", "42", "-3", "0.5"]


def test_answers_equal():
    assert answers_equal(" 42 ", "42") and answers_equal("42.0", "42")
    assert not answers_equal("41", "42") and not answers_equal("forty-two", "42")


def test_episode_tool_then_answer():
    episode = CalculatorEpisode(ground_truth="42")
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>'
    assert episode.step(text) == [{"role": "tool", "content": "42"}]
    assert not episode.done and episode.reward == 0.0
    assert episode.step("<answer>42</answer>") == []
    assert episode.done and episode.reward == 1.0
    assert (episode.num_tool_calls, episode.tool_errors) == (1, 0)


def test_episode_bad_call_counts_an_error():
    episode = CalculatorEpisode(ground_truth="42")
    assert episode.step("<tool_call>not json</tool_call>")[0]["content"].startswith("error:")
    assert episode.tool_errors == 1 and not episode.done


@pytest.mark.parametrize(
    "text, must_call_tool, reward",
    [
        ("<answer>42</answer>", False, 1.0),
        ("<answer>42</answer>", True, 0.0),  # right, but skipped the required tool
        ("<answer>41</answer>", False, 0.0),
        ("It is 42.", False, 0.0),  # neither a call nor an answer ends the episode
    ],
)
def test_episode_answer(text, must_call_tool, reward):
    episode = CalculatorEpisode(ground_truth="42", must_call_tool=must_call_tool)
    episode.step(text)
    assert episode.done and episode.reward == reward
