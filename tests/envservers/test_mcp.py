"""The `mcp` bridge against a real MCP server we did not write (PyPI `mcp-server-time`),
started over stdio by our server."""

import json

import grpc
import pytest
import pytest_asyncio

from envservers.server import EnvServer
from protos.client import EnvClient
from tests.envservers.conftest import server_config

TIME_SERVER = {"command": "python", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}


@pytest_asyncio.fixture(scope="module")
async def mcp_client():
    config = server_config(envs=["mcp"], metrics_port=None, mcp={"servers": {"time": TIME_SERVER}})
    async with EnvServer(config) as server, EnvClient(server.address, timeout_s=30) as client:
        yield client


def _task(**spec):
    return {
        "data_source": "time",
        "env_class": "mcp",
        "prompt": [{"role": "user", "content": "What time is 12:00 UTC in Tokyo?"}],
        "reward_spec": {"method": "rule", "ground_truth": {"answer": "21:00", **spec}},
    }


def _call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


async def test_tools_come_from_the_mcp_server(mcp_client):
    session = await mcp_client.open("mcp", _task())
    names = {t["function"]["name"] for t in session.observation.tools}
    assert names == {"get_current_time", "convert_time"}
    convert = next(t for t in session.observation.tools if t["function"]["name"] == "convert_time")
    assert convert["function"]["parameters"]["required"] == [
        "source_timezone",
        "time",
        "target_timezone",
    ]


async def test_episode_with_a_real_tool_call_and_tool_sequence_reward(mcp_client):
    session = await mcp_client.open(
        "mcp", _task(tool_sequence=[{"step": 1, "server": "time", "tool": "convert_time"}])
    )
    result = await session.step(
        _call("convert_time", source_timezone="UTC", time="12:00", target_timezone="Asia/Tokyo")
    )
    reply = json.loads(result.observations[0]["content"])
    assert reply["target"]["datetime"].endswith("T21:00:00+09:00")
    assert reply["time_difference"] == "+9.0h"
    final = await session.step("<answer>21:00</answer>")
    assert (final.reward, final.done) == (1.0, True)
    assert final.metadata["num_tool_calls"] == 1 and final.metadata["tool_errors"] == 0


@pytest.mark.parametrize(
    "action, fragment",
    [
        (_call("get_current_time", timezone="Nowhere/Bad"), "error: Error executing tool"),
        (_call("get_current_time"), "error: bad arguments for get_current_time: missing"),
        (_call("get_weather", city="Oslo"), "error: unknown tool 'get_weather'"),
        ("<tool_call>{broken</tool_call>", "error: tool call is not valid JSON"),
    ],
)
async def test_tool_failures_are_error_observations(mcp_client, action, fragment):
    session = await mcp_client.open("mcp", _task())
    result = await session.step(action)
    assert result.observations[0]["content"].startswith(fragment)
    assert result.done is False and result.metadata["tool_errors"] == 1


async def test_a_server_that_cannot_start_fails_the_env_server_start():
    config = server_config(
        envs=["mcp"],
        metrics_port=None,
        mcp={
            "servers": {"bad": {"command": "python", "args": ["-c", "raise SystemExit(3)"]}},
            "startup_timeout_s": 10,
        },
    )
    with pytest.raises(ValueError, match="MCP server 'bad'"):
        async with EnvServer(config):
            pass


async def test_unknown_env_on_mcp_server_is_not_found(mcp_client):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await mcp_client.open("calculator", _task())
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
