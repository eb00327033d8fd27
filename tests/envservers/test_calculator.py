"""The calculator environment against its contract (envservers/envs/calculator.py, the tool
environments of docs/envservers.md), driven directly (no gRPC)."""

import pytest

from envservers.envs.calculator import CalculatorEnv, format_number
from tests.envservers.conftest import calculator_task


def _call(name, **arguments):
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


async def _env(**spec):
    env = CalculatorEnv()
    obs = await env.reset(calculator_task(**spec))
    return env, obs


async def test_reset_returns_prompt_and_openai_tool_specs():
    env, obs = await _env()
    assert obs.messages == calculator_task()["prompt"]
    assert [t["function"]["name"] for t in obs.tools] == ["add", "subtract", "multiply", "divide"]
    assert obs.tools[0]["type"] == "function"
    assert obs.tools[0]["function"]["parameters"]["required"] == ["a", "b"]
    assert obs.metadata == {"num_tool_calls": 0, "tool_errors": 0, "turns": 0}


async def test_a_row_can_narrow_the_tools_offered():
    task = calculator_task()
    task["extra_info"]["tools"] = ["add"]
    env = CalculatorEnv()
    obs = await env.reset(task)
    assert [t["function"]["name"] for t in obs.tools] == ["add"]
    result = await env.step(_call("multiply", a=2, b=3))
    assert "unknown tool 'multiply'" in result.observations[0]["content"]


@pytest.mark.parametrize("tools", [["add", "power"], [], "add", [1]])
async def test_bad_tool_subsets_are_refused_at_reset(tools):
    task = calculator_task()
    task["extra_info"]["tools"] = tools
    with pytest.raises(ValueError, match="tools"):
        await CalculatorEnv().reset(task)


@pytest.mark.parametrize(
    "name, a, b, expected",
    [
        ("add", 12, 30, "42"),
        ("subtract", 12, 30, "-18"),
        ("multiply", 2.5, 4, "10"),
        ("divide", 10, 4, "2.5"),
        ("divide", 1, 3, "0.3333333333333333"),
        ("add", 0.1, 0.2, "0.30000000000000004"),
    ],
)
async def test_tool_results_are_numbers_without_trailing_zero(name, a, b, expected):
    env, _ = await _env()
    result = await env.step(_call(name, a=a, b=b))
    assert result.observations == [{"role": "tool", "content": expected}]
    assert (result.reward, result.done) == (0.0, False)
    assert result.metadata["num_tool_calls"] == 1 and result.metadata["tool_errors"] == 0


@pytest.mark.parametrize(
    "action, fragment",
    [
        (_call("divide", a=1, b=0), "error: division by zero"),
        (_call("power", a=1, b=2), "error: unknown tool 'power'"),
        (_call("add", a=1), "error: bad arguments for add: missing required argument 'b'"),
        (_call("add", a="1", b=2), "error: bad arguments for add"),
        ("<tool_call>{not json}</tool_call>", "error: tool call is not valid JSON"),
        (_call("multiply", a=1e308, b=10), "error: result is not a finite number"),
    ],
)
async def test_failed_calls_are_error_observations_and_episode_goes_on(action, fragment):
    env, _ = await _env()
    result = await env.step(action)
    [message] = result.observations
    assert message["role"] == "tool" and message["content"].startswith(fragment)
    assert (result.reward, result.done) == (0.0, False)
    assert result.metadata["tool_errors"] == 1


async def test_full_episode_tool_then_answer():
    env, _ = await _env()
    await env.step(_call("add", a=17, b=25))
    result = await env.step("The tool says 42. <answer>42</answer>")
    assert (result.reward, result.done, result.observations) == (1.0, True, [])
    assert result.metadata == {
        "num_tool_calls": 1,
        "tool_errors": 0,
        "turns": 2,
        "stop_reason": "answer",
    }


@pytest.mark.parametrize("answer, reward", [("42", 1.0), ("42.0", 1.0), ("41", 0.0), ("", 0.0)])
async def test_answer_compared_numerically(answer, reward):
    env, _ = await _env()
    result = await env.step(f"<answer>{answer}</answer>")
    assert (result.reward, result.done) == (reward, True)


async def test_neither_call_nor_answer_ends_with_zero():
    env, _ = await _env()
    result = await env.step("I think it is 42.")
    assert (result.reward, result.done, result.metadata["stop_reason"]) == (0.0, True, "no_action")


async def test_must_call_tool_and_tool_sequence():
    env, _ = await _env(must_call_tool=True)
    assert (await env.step("<answer>42</answer>")).reward == 0.0
    env, _ = await _env(must_call_tool=True)
    await env.step(_call("add", a=1, b=0))  # a failed call would not count; this one succeeds
    assert (await env.step("<answer>42</answer>")).reward == 1.0
    env, _ = await _env(tool_sequence=["add"])
    await env.step(_call("multiply", a=6, b=7))
    assert (await env.step("<answer>42</answer>")).reward == 0.0


async def test_failed_call_does_not_satisfy_must_call_tool():
    env, _ = await _env(must_call_tool=True)
    await env.step(_call("add", a=1))
    result = await env.step("<answer>42</answer>")
    assert result.reward == 0.0 and result.metadata["tool_errors"] == 1


async def test_tool_calls_win_over_an_answer_in_the_same_message():
    env, _ = await _env()
    result = await env.step(_call("add", a=17, b=25) + " <answer>42</answer>")
    assert result.done is False and result.observations == [{"role": "tool", "content": "42"}]


async def test_too_many_calls_in_one_message():
    env = CalculatorEnv(max_tool_calls_per_step=2)
    await env.reset(calculator_task())
    result = await env.step(_call("add", a=1, b=1) * 3)
    assert [m["content"] for m in result.observations] == [
        "2",
        "2",
        "error: at most 2 tool calls per turn",
    ]


async def test_max_turns_from_extra_info():
    task = calculator_task()
    task["extra_info"]["max_turns"] = 2
    env = CalculatorEnv()
    await env.reset(task)
    assert not (await env.step(_call("add", a=1, b=1))).done
    last = await env.step(_call("add", a=1, b=1))
    assert last.done and last.reward == 0.0 and last.metadata["stop_reason"] == "max_turns"


def test_format_number():
    assert [format_number(x) for x in (42, 42.0, -3.0, 2.5, 10**20)] == [
        "42",
        "42",
        "-3",
        "2.5",
        "100000000000000000000",
    ]
