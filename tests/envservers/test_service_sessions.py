"""The session table under concurrent Resets: the servicer is called directly on
one event loop, so the interleaving is exact. Reset used to check, await `env.reset()`, then
insert: two Resets of one session id both made an env (the first never closed, the gauge
counted twice), and a burst of Resets passed `max_sessions`."""

import asyncio
import json

import grpc
import pytest

from envservers import metrics
from envservers.service import EnvService
from envservers.types import Environment, EnvProvider
from protos import env_pb2
from tests.envservers.conftest import server_config
from tests.envservers.fakes import GatedProvider


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code


class FakeContext:
    """The part of grpc.aio.ServicerContext the servicer uses."""

    async def abort(self, code, details):
        raise Aborted(code, details)

    def time_remaining(self):
        return None


def _reset(session_id: str) -> env_pb2.ResetRequest:
    task = {"prompt": [{"role": "user", "content": "hi"}]}
    return env_pb2.ResetRequest(
        env_class="gated", task_json=json.dumps(task), session_id=session_id
    )


def _gauge() -> float:
    return metrics.ACTIVE_SESSIONS.labels("gated")._value.get()


@pytest.fixture
def gated():
    provider = GatedProvider()
    service = EnvService({"gated": provider}, server_config(envs=["noop"], max_sessions=3))
    return service, provider


async def _settle() -> None:
    for _ in range(10):  # let every started Reset run up to the point where it waits
        await asyncio.sleep(0)


async def test_concurrent_resets_of_one_session_make_one_env(gated):
    service, provider = gated
    before = _gauge()
    first = asyncio.create_task(service.Reset(_reset("same"), FakeContext()))
    second = asyncio.create_task(service.Reset(_reset("same"), FakeContext()))
    await _settle()
    provider.gate.set()
    answers = await asyncio.gather(first, second)
    assert answers[0] == answers[1] and answers[0].session_id == "same"
    assert provider.num_made == 1
    assert list(service.sessions) == ["same"]
    assert _gauge() - before == 1
    await service.close_all()
    assert provider.num_closed == 1 and _gauge() == before


async def test_a_burst_of_resets_cannot_pass_max_sessions(gated):
    service, provider = gated
    before = _gauge()
    resets = [asyncio.create_task(service.Reset(_reset(f"s{i}"), FakeContext())) for i in range(5)]
    await _settle()
    provider.gate.set()
    results = await asyncio.gather(*resets, return_exceptions=True)
    refused = [r for r in results if isinstance(r, Aborted)]
    assert len(service.sessions) == 3 and provider.num_made == 3
    assert [r.code for r in refused] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
    assert _gauge() - before == 3
    await service.close_all()
    assert provider.num_closed == 3


class _RejectingEnv(Environment):
    async def reset(self, task):
        await asyncio.sleep(0)  # the other Reset of this id arrives meanwhile
        raise ValueError("extra_info: this row is refused")

    async def step(self, action_text):
        raise AssertionError("never reset")


class _RejectingProvider(EnvProvider):
    def make(self):
        return _RejectingEnv()


async def test_a_failed_reset_fails_the_concurrent_one_and_frees_the_id():
    service = EnvService({"rejecting": _RejectingProvider()}, server_config(envs=["noop"]))
    bad = env_pb2.ResetRequest(env_class="rejecting", task_json="{}", session_id="x")
    # The first Reset is INVALID_ARGUMENT; the one waiting on it is ABORTED (the client
    # retries it elsewhere), never left hanging; the id is free again.
    results = await asyncio.gather(
        service.Reset(bad, FakeContext()),
        service.Reset(bad, FakeContext()),
        return_exceptions=True,
    )
    assert [r.code for r in results] == [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.ABORTED,
    ]
    assert service.sessions == {} and service._resetting == {}
