"""`Actor.ready`, what an actor replica's /readyz reports (its Kubernetes readiness probe):
false until the engine's start-up weights are settled, then true exactly while the engine
holds the newest announced version (or follows the broadcast), false again while stopping.
Real nats-server, scripted engine."""

from __future__ import annotations

import asyncio

import pytest

from actors.actor import Actor
from actors.chat import ChatTemplate
from actors.config import ActorConfig
from broker import client as bus
from broker.config import BrokerConfig
from broker.wire import PolicyVersion
from demo.tokenizer import build_tokenizer
from tests.fakes import InProcessEnv, ScriptedEngine, by_turn


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(num_conversations=200)


async def _until(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_ready_tracks_the_newest_announced_version(tokenizer, nats_server, bus_names):
    broker = BrokerConfig(
        url=nats_server.url, namespace=bus_names.namespace, max_trajectory_bytes=16 * 1024**2
    )
    config = ActorConfig.model_validate(
        dict(engine={"model": "unused"}, metrics_port=0, fetch_timeout_s=0.2, drain_timeout_s=0)
    )
    engine = ScriptedEngine(tokenizer, by_turn("<answer>1</answer>"))
    actor = Actor(
        config=config,
        broker=broker,
        engine=engine,
        env=InProcessEnv(),
        chat=ChatTemplate(tokenizer),
        actor_id="r0",
    )
    nc = await bus.connect(broker.url, name="test")
    js = nc.jetstream()
    await bus.ensure_streams(js, broker.names, broker.stream_limits())
    policy = bus.PolicyStore(js, broker.names)
    await policy.publish(
        PolicyVersion(version=5, published_at=0.0, snapshot_path="/snap/v5", snapshot_version=5)
    )
    assert not actor.ready  # no engine weights settled yet
    stop = asyncio.Event()
    running = asyncio.create_task(actor.run(stop))
    try:
        await _until(lambda: actor.ready)
        assert engine.version == 5  # it loaded the snapshot before saying so
        # A newer version with nothing to load it from (no snapshot, no broadcast): behind.
        await policy.publish(PolicyVersion(version=7, published_at=0.0))
        await _until(lambda: not actor.ready)
        await policy.publish(
            PolicyVersion(version=8, published_at=0.0, snapshot_path="/snap/v8", snapshot_version=8)
        )
        await _until(lambda: actor.ready)
        stop.set()
        assert not actor.ready  # draining: take it out of service
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=30)
        await nc.close()
