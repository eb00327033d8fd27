"""A real env server on loopback: episodes through the client, every bad input's status
code, deadlines, isolation of a failing session, health, reflection, idle TTL, metrics,
retries and round robin."""

import asyncio
import json
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from envservers.server import EnvServer
from protos import env_pb2, env_pb2_grpc
from protos.client import EnvClient
from tests.envservers.conftest import calculator_task, server_config
from tests.envservers.fakes import FaultyProvider

ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
Code = grpc.StatusCode


@pytest.fixture
async def stub(env_server):
    async with grpc.aio.insecure_channel(env_server.address) as channel:
        yield env_pb2_grpc.EnvServiceStub(channel)


async def _status(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details()


async def test_calculator_episode_through_the_client(client):
    session = await client.open("calculator", calculator_task())
    assert session.observation.messages[1]["content"] == "What is 17 + 25?"
    assert [t["function"]["name"] for t in session.observation.tools][0] == "add"
    first = await session.step(ADD)
    assert first.observations == [{"role": "tool", "content": "42"}]
    assert (first.reward, first.done) == (0.0, False)
    last = await session.step("<answer>42</answer>")
    assert (last.reward, last.done) == (1.0, True)
    assert last.metadata["num_tool_calls"] == 1 and last.metadata["tool_errors"] == 0
    await session.close()


async def test_list_envs(client):
    envs = await client.list_envs()
    assert {"calculator", "noop", "sql", "python", "faulty", "slow"} <= set(envs)


async def test_unknown_env_is_not_found(stub):
    code, details = await _status(stub.Reset(env_pb2.ResetRequest(env_class="chess")))
    assert code == Code.NOT_FOUND and "env_class" in details and "chess" in details


async def test_unknown_and_closed_sessions_are_not_found(client, stub):
    code, details = await _status(stub.Step(env_pb2.StepRequest(session_id="nope", action="x")))
    assert code == Code.NOT_FOUND and "session_id" in details
    session = await client.open("calculator", calculator_task())
    await session.close()
    code, _ = await _status(session.step(ADD))
    assert code == Code.NOT_FOUND
    code, _ = await _status(stub.Close(env_pb2.CloseRequest(session_id=session.session_id)))
    assert code == Code.NOT_FOUND


@pytest.mark.parametrize(
    "request_, field",
    [
        (env_pb2.ResetRequest(env_class=""), "env_class"),
        (env_pb2.ResetRequest(env_class="calculator", task_json="{oops"), "task_json"),
        (env_pb2.ResetRequest(env_class="calculator", task_json="[1, 2]"), "task_json"),
        (env_pb2.ResetRequest(env_class="calculator", task_json='{"prompt": "hi"}'), "task.prompt"),
        (
            env_pb2.ResetRequest(
                env_class="calculator", task_json='{"prompt": [{"role": "user", "content": 3}]}'
            ),
            "task.prompt[0].content",
        ),
        (
            env_pb2.ResetRequest(
                env_class="calculator", task_json='{"reward_spec": {"must_call_tool": 5}}'
            ),
            "must_call_tool",
        ),
        (
            env_pb2.ResetRequest(env_class="faulty", task_json='{"extra_info": {"reject": 1}}'),
            "extra_info.reject",
        ),
    ],
)
async def test_malformed_reset_is_invalid_argument_naming_the_field(stub, request_, field):
    code, details = await _status(stub.Reset(request_))
    assert code == Code.INVALID_ARGUMENT and field in details


async def test_malformed_step_and_close(stub):
    code, details = await _status(stub.Step(env_pb2.StepRequest(action="x")))
    assert code == Code.INVALID_ARGUMENT and "session_id" in details
    code, details = await _status(stub.Close(env_pb2.CloseRequest()))
    assert code == Code.INVALID_ARGUMENT and "session_id" in details


async def test_oversized_action_and_message_are_resource_exhausted(client, stub):
    session = await client.open("calculator", calculator_task())
    code, details = await _status(session.step("x" * 200_000))  # > max_action_chars
    assert code == Code.RESOURCE_EXHAUSTED and "action" in details
    code, _ = await _status(
        stub.Step(env_pb2.StepRequest(session_id=session.session_id, action="x" * 2_000_000))
    )  # > max_message_bytes: refused by gRPC itself
    assert code == Code.RESOURCE_EXHAUSTED
    assert (await session.step(ADD)).observations[0]["content"] == "42"  # still usable


async def test_exception_in_one_session_fails_only_that_call(client):
    faulty = await client.open("faulty", {"prompt": []})
    healthy = await client.open("calculator", calculator_task())
    results = await asyncio.gather(faulty.step("boom"), healthy.step(ADD), return_exceptions=True)
    assert isinstance(results[0], grpc.aio.AioRpcError)
    assert results[0].code() == Code.INTERNAL and "the env blew up" in results[0].details()
    assert results[1].observations[0]["content"] == "42"
    faulty.num_steps -= 1  # the failed step did not count on the server
    assert (await faulty.step("fine")).observations == [{"role": "user", "content": "fine"}]


async def test_a_session_the_provider_cannot_make_fails_that_reset_as_internal(client):
    code, details = await _status(client.open("unmakeable", {"prompt": []}))
    assert code == Code.INTERNAL
    assert details == "making a unmakeable session failed: RuntimeError: no sandbox left"
    assert (await client.open("faulty", {"prompt": []})).session_id  # still serving


async def test_step_after_done_is_failed_precondition(client):
    session = await client.open("calculator", calculator_task())
    await session.step("<answer>42</answer>")
    code, details = await _status(session.step(ADD))
    assert code == Code.FAILED_PRECONDITION and "done" in details


async def test_retried_step_is_replayed_not_repeated(client, stub):
    session = await client.open("faulty", {"prompt": []})
    request = env_pb2.StepRequest(session_id=session.session_id, action="a", seq=1)
    first = await stub.Step(request)
    again = await stub.Step(request)
    assert first == again
    code, details = await _status(
        stub.Step(env_pb2.StepRequest(session_id=session.session_id, action="b", seq=5))
    )
    assert code == Code.FAILED_PRECONDITION and "seq" in details


async def test_retried_reset_with_same_session_id_is_idempotent(env_server, stub):
    request = env_pb2.ResetRequest(
        env_class="calculator", task_json=json.dumps(calculator_task()), session_id="fixed-1"
    )
    before = len(env_server.service.sessions)
    assert await stub.Reset(request) == await stub.Reset(request)
    assert len(env_server.service.sessions) == before + 1


async def test_client_deadline_is_honoured_and_server_keeps_serving(client):
    slow = await client.open("slow", {})
    start = time.monotonic()
    code, _ = await _status(slow.step("5", timeout_s=0.3))
    assert code == Code.DEADLINE_EXCEEDED and time.monotonic() - start < 2
    session = await client.open("calculator", calculator_task())
    assert (await session.step(ADD)).observations[0]["content"] == "42"


async def test_concurrent_sessions_are_independent(client):
    sessions = await asyncio.gather(
        *(client.open("calculator", calculator_task(truth=str(i))) for i in range(20))
    )
    results = await asyncio.gather(
        *(s.step(f"<answer>{i}</answer>") for i, s in enumerate(sessions))
    )
    assert [r.reward for r in results] == [1.0] * 20


async def test_health_and_reflection(env_server):
    async with grpc.aio.insecure_channel(env_server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "tether.env.v1.EnvService"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        names = []
        async for reply in reflection.ServerReflectionInfo(iter([request])):
            names = [s.name for s in reply.list_services_response.service]
        assert "tether.env.v1.EnvService" in names and "grpc.health.v1.Health" in names


async def test_metrics_are_served(env_server, client, stub):
    session = await client.open("noop", {})
    await session.step('<tool_call>{"name": "noop", "arguments": {}}</tool_call>')
    # Its own failed Reset: the error counter must not depend on which tests ran before on
    # this worker.
    code, _ = await _status(stub.Reset(env_pb2.ResetRequest(env_class="chess")))
    assert code == Code.NOT_FOUND
    url = f"http://127.0.0.1:{env_server.metrics_port}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read().decode())
    assert 'tether_env_steps_total{env="noop"}' in text
    assert 'tether_env_step_seconds_bucket{env="noop",le="0.001"}' in text
    assert 'tether_env_active_sessions{env="noop"}' in text
    assert 'tether_env_errors_total{code="NOT_FOUND",method="Reset"}' in text


async def test_idle_sessions_expire_and_max_sessions_is_enforced():
    config = server_config(
        envs=["calculator"], session_idle_ttl_s=0.2, max_sessions=2, metrics_port=None
    )
    async with EnvServer(config) as server, EnvClient(server.address, max_retries=0) as client:
        first = await client.open("calculator", calculator_task())
        await client.open("calculator", calculator_task())
        code, details = await _status(client.open("calculator", calculator_task()))
        assert code == Code.RESOURCE_EXHAUSTED and "sessions" in details
        await asyncio.sleep(0.6)
        assert server.service.sessions == {}
        code, _ = await _status(first.step(ADD))
        assert code == Code.NOT_FOUND


async def test_client_retries_unavailable_and_round_robins():
    config = server_config(envs=["calculator"], metrics_port=None)
    async with EnvServer(config) as a, EnvServer(config, {"calculator": FaultyProvider()}) as b:
        # b answers as "faulty" under the calculator name: the reply tells which one served
        async with EnvClient([a.address, b.address], max_retries=0) as client:
            opened = [await client.open("calculator", calculator_task()) for _ in range(4)]
            assert [s.address for s in opened] == [a.address, b.address] * 2
        dead = "127.0.0.1:1"  # nothing listens: UNAVAILABLE, retried on the next address
        async with EnvClient([dead, a.address], max_retries=2, backoff_s=0.01) as client:
            session = await client.open("calculator", calculator_task())
            assert session.address == a.address
            assert (await session.step(ADD)).observations[0]["content"] == "42"
        async with EnvClient([dead], max_retries=1, backoff_s=0.01, timeout_s=2) as client:
            code, _ = await _status(client.open("calculator", calculator_task()))
            assert code == Code.UNAVAILABLE


async def test_each_session_reads_calls_in_the_format_its_client_asks(env_server, stub):
    """One server (hermes by default) serves a Qwen3-Coder actor and a Hermes actor at once;
    a format it does not know is refused at reset."""
    qwen3 = (
        "<tool_call>\n<function=add>\n<parameter=a>\n17\n</parameter>\n"
        "<parameter=b>\n25\n</parameter>\n</function>\n</tool_call>"
    )
    async with EnvClient(env_server.address, tool_format="qwen3_coder") as coder:
        session = await coder.open("calculator", calculator_task())
        assert (await session.step(qwen3)).observations == [{"role": "tool", "content": "42"}]
        assert (await session.step(ADD)).observations[0]["content"].startswith("error: ")
        await session.close()
    async with EnvClient(env_server.address) as hermes:
        session = await hermes.open("calculator", calculator_task())
        assert (await session.step(ADD)).observations == [{"role": "tool", "content": "42"}]
        await session.close()
    request = env_pb2.ResetRequest(
        env_class="calculator", task_json=json.dumps(calculator_task()), tool_format="harmony"
    )
    code, details = await _status(stub.Reset(request))
    assert code == Code.INVALID_ARGUMENT and "tool_format" in details and "mistral" in details
