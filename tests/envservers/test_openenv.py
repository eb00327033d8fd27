"""OpenEnv environment servers proxied through ours: the echo env from OpenEnv's own
template (text mode) and an OpenEnv MCPEnvironment (tools mode), both served locally."""

import asyncio
import json
import socket
import sys
import time
from pathlib import Path

import pytest
import pytest_asyncio

from envservers.server import EnvServer
from protos.client import EnvClient
from tests.envservers.conftest import server_config

APP = Path(__file__).with_name("openenv_app.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest_asyncio.fixture(scope="module")
async def openenv_url(tmp_path_factory):
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(APP),
        str(port),
        str(tmp_path_factory.mktemp("openenv")),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError((await proc.stderr.read()).decode()[-2000:]) from None
                await asyncio.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        await proc.wait()


@pytest_asyncio.fixture(scope="module")
async def proxy(openenv_url):
    config = server_config(
        envs=["openenv:echo", "openenv:calc"],
        metrics_port=None,
        openenv={
            "echo": {
                "base_url": f"{openenv_url}/echo",
                "mode": "text",
                "action_field": "message",
                "observation_field": "echoed_message",
            },
            "calc": {"base_url": f"{openenv_url}/calc", "mode": "tools"},
        },
    )
    async with EnvServer(config) as server, EnvClient(server.address, timeout_s=30) as client:
        yield client


def _task(prompt="hi", **spec):
    return {
        "data_source": "openenv",
        "prompt": [{"role": "user", "content": prompt}],
        "reward_spec": {"method": "rule", **spec},
    }


async def test_text_mode_echo_env(proxy):
    session = await proxy.open("openenv:echo", _task())
    assert session.observation.messages[-1] == {
        "role": "user",
        "content": "Echo Env environment ready!",
    }
    result = await session.step("hello")
    assert result.observations == [{"role": "user", "content": "hello"}]
    assert result.reward == pytest.approx(0.5) and result.done is False  # 0.1 per character
    await session.close()


async def test_tools_mode_mcp_env(proxy):
    session = await proxy.open("openenv:calc", _task(ground_truth="5", must_call_tool="add"))
    tools = {t["function"]["name"]: t["function"] for t in session.observation.tools}
    assert set(tools) == {"add", "fail"}
    assert tools["add"]["parameters"]["required"] == ["a", "b"]
    call = {"name": "add", "arguments": {"a": 2, "b": 3}}
    result = await session.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert result.observations == [{"role": "tool", "content": "5"}]
    failing = {"name": "fail", "arguments": {"x": 1}}
    result = await session.step(f"<tool_call>{json.dumps(failing)}</tool_call>")
    assert result.observations[0]["content"].startswith("error: Error calling tool 'fail'")
    assert "always fails" in result.observations[0]["content"]
    final = await session.step("<answer>5</answer>")
    assert (final.reward, final.done) == (1.0, True)
    assert final.metadata["num_tool_calls"] == 2 and final.metadata["tool_errors"] == 1
    await session.close()
