"""A replica's start (actors/replica.py, actors/replicas.py, actors/env_health.py): a
replica that cannot start as configured (an engine the learner refuses included) is not
restarted, and env servers are asked at once, named when silent, and asked again until they
answer."""

from __future__ import annotations

import asyncio
import logging

import pytest

from actors import replica
from actors.config import ActorConfig
from actors.env_health import check_then_watch, silent_servers
from actors.replicas import ReplicaSpec, supervise
from broker.config import BrokerConfig
from common.procs import free_port
from common.supervision import (
    EXIT_CONFIG,
    EXIT_GAVE_UP,
    EXIT_UNREACHABLE,
    Events,
    RestartPolicy,
    read_events,
)
from envservers.config import EnvServerConfig
from envservers.server import EnvServer
from protos.client import EnvClient
from tests.fakes import FakeReplicaHandle
from weights.actor_side.subscription import AdapterMismatch, WeightDtypeMismatch


class _Launcher:
    def __init__(self, exitcode_of_replica_0):
        self.exitcode, self.handles = exitcode_of_replica_0, []

    def start(self, spec):
        self.handles.append(FakeReplicaHandle(spec, self.exitcode if spec.index == 0 else None))
        return self.handles[-1]


def test_a_final_exit_code_is_not_restarted_and_stops_the_actor_with_it():
    for code in (EXIT_CONFIG, EXIT_UNREACHABLE):
        launcher = _Launcher(code)
        specs = [ReplicaSpec(index=i, config_path=None) for i in range(2)]
        result = supervise(
            launcher,
            specs,
            should_stop=lambda: False,
            policy=RestartPolicy(initial_backoff_s=0.0),
            poll_s=0,
        )
        assert result == code
        assert [h.spec.index for h in launcher.handles] == [0, 1]  # replica 0 never again
        assert launcher.handles[1].terminated  # the other one is stopped


def test_a_crash_is_still_restarted():
    launcher = _Launcher(1)
    polls = []
    supervise(
        launcher,
        [ReplicaSpec(index=0, config_path=None)],
        should_stop=lambda: polls.append(1) or len(polls) > 3,
        policy=RestartPolicy(initial_backoff_s=0.0),
        poll_s=0,
    )
    assert len(launcher.handles) > 1


def test_a_replica_that_spends_its_budget_stops_the_actor_with_a_final_code(tmp_path):
    """The launcher above the actor takes EXIT_GAVE_UP as final: the replica's budget is the
    only one, not multiplied by the launcher's restarts of the actor process."""
    launcher = _Launcher(1)
    code = supervise(
        launcher,
        [ReplicaSpec(index=0, config_path=None)],
        should_stop=lambda: False,
        policy=RestartPolicy(initial_backoff_s=0.0, budget=2),
        events=Events(tmp_path / "events.jsonl"),
        role="actor-3",
        poll_s=0,
    )
    assert code == EXIT_GAVE_UP
    assert len(launcher.handles) == 3  # the first start and two restarts
    events = [(e["role"], e["event"], e.get("restart")) for e in read_events(tmp_path)]
    assert events == [
        ("actor-3/replica-0", "started", 0),
        ("actor-3/replica-0", "exited", None),
        ("actor-3/replica-0", "started", 1),
        ("actor-3/replica-0", "exited", None),
        ("actor-3/replica-0", "started", 2),
        ("actor-3/replica-0", "gave_up", None),
    ]


async def test_a_silent_env_server_is_named_then_asked_until_it_answers(caplog):
    caplog.set_level(logging.INFO, logger="actors.env_health")
    address = f"127.0.0.1:{free_port()}"
    client = EnvClient([address], max_retries=0)
    watching = await check_then_watch(client)
    assert f"env server not answering at {address} (UNAVAILABLE" in caplog.text
    config = EnvServerConfig(port=int(address.split(":")[1]), metrics_port=None, drain_s=0)
    async with EnvServer(config):
        await asyncio.wait_for(watching, 15)  # asked again 1 s, 2 s, 4 s... after the first
        assert "env servers answer now" in caplog.text
        async with EnvClient([address]) as again:
            assert await silent_servers(again) == {}


@pytest.mark.parametrize("refusal", [WeightDtypeMismatch, AdapterMismatch])
async def test_an_engine_the_learner_refuses_ends_the_replica_as_a_config_error(
    refusal, monkeypatch
):
    # An fp32 learner refusing a bf16 engine used to end the replica with exit code 1: it was
    # restarted, refused again, and generated a little each time with weights nobody updated.
    async def broker_answers(*args, **kwargs):
        return None

    class RefusedActor:
        ready = False

        async def run(self, stop):
            raise refusal("the learner computes in float32 but the engine runs in bfloat16")

    async def build(spec, config, broker):
        return RefusedActor(), lambda: None

    monkeypatch.setattr(replica, "wait_for_broker", broker_answers)
    config = ActorConfig(engine={"model": "m"}, metrics_port=0)
    spec = ReplicaSpec(index=0, config_path=None)
    with pytest.raises(replica.CannotStart) as refused:
        await replica._serve(spec, build, config, BrokerConfig(), check_env=False)
    assert refused.value.exit_code == EXIT_CONFIG
    assert "the learner refuses this engine" in str(refused.value)
    assert "bfloat16" in str(refused.value)
