"""An actor outside the learner's network (`weight_source = "store"`, no broadcast joined)
that starts when the learner is at version N reaches version N bit for bit from the newest
snapshot plus the weights log, then follows the next version from its own rebuild. Real
parts: the Trainer taking optimizer steps, `RankCommands` writing snapshots and the log,
the learner's announcer on a real nats-server, an Actor around the real vLLM engine."""

from __future__ import annotations

import asyncio

import pytest
import torch

from actors.actor import Actor
from actors.chat import ChatTemplate
from actors.config import ActorConfig
from broker import client as bus
from broker.config import BrokerConfig
from learner.announce import PolicyAnnouncer
from learner.trainer.ranks import RankCommands
from learner.trainer.trainer import Trainer
from tests.fakes import InProcessEnv
from tests.learner.builders import learner_config, random_samples
from weights.formats.snapshot import safetensors_weights
from weights.shared.tensors import checksum

vllm = pytest.mark.vllm


def _learner(tiny_model_dir, tmp_path) -> RankCommands:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trainer = Trainer(model, learner_config(optim={"lr": 1e-4}))
    return RankCommands(
        trainer,
        checkpoint_dir=str(tmp_path / "checkpoints"),
        keep=1,
        snapshot_dir=tmp_path / "weights",
        snapshot_interval=4,
        snapshot_deltas=True,
    )


def _step(commands: RankCommands) -> int:
    commands.train(random_samples(num_samples=4, seed=commands.version))
    commands.publish_weights(commands.version)
    return commands.version


async def _until(condition, what: str, timeout_s: float = 120) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


async def _holds(engine, commands: RankCommands, rebuilt: str) -> None:
    """The engine loaded exactly the learner's cast of its current version."""
    learner = dict(commands.trainer.full_weights(dtype=commands.trainer.weights_dtype))
    on_disk = dict(safetensors_weights(rebuilt))
    assert on_disk.keys() == learner.keys()
    for name, tensor in learner.items():
        assert torch.equal(on_disk[name].view(torch.uint8), tensor.view(torch.uint8)), name
    expected, got = checksum(learner.items()), await engine.weights_checksum()
    assert got["num_tensors"] == expected["num_tensors"]
    assert got["sum"] == pytest.approx(expected["sum"], rel=1e-12)
    assert got["sum_sq"] == pytest.approx(expected["sum_sq"], rel=1e-12)


@vllm
async def test_an_actor_without_the_broadcast_joins_at_version_n_bit_for_bit(
    vllm_engine, tiny_model_dir, tokenizer, nats_server, bus_names, tmp_path
):
    commands = _learner(tiny_model_dir, tmp_path)
    commands.start_weights_log()  # snapshot v0, the log's first keyframe
    for _ in range(6):
        _step(commands)  # snapshot v4; deltas v5, v6 (v1-v4 pruned with it)
    deltas = sorted(p.name for p in (tmp_path / "weights" / "deltas").glob("*.delta"))
    assert deltas == ["v000005.delta", "v000006.delta"]
    await vllm_engine.load_snapshot(str(tiny_model_dir), 0)  # the session engine, at v0

    broker = BrokerConfig(url=nats_server.url, namespace=bus_names.namespace)
    config = ActorConfig.model_validate(
        dict(
            engine={"model": "unused"},
            metrics_port=0,
            fetch_timeout_s=0.2,
            drain_timeout_s=0,
            weight_source="store",
        )  # fmt: skip
    )
    actor = Actor(config=config, broker=broker, engine=vllm_engine, env=InProcessEnv(),
                  chat=ChatTemplate(tokenizer), actor_id="remote")  # fmt: skip
    nc = await bus.connect(broker.url, name="learner")
    try:
        js = nc.jetstream()
        await bus.ensure_streams(js, broker.names, broker.stream_limits())
        announcer = PolicyAnnouncer(bus.PolicyStore(js, broker.names), commands,
            initial_weights=str(tiny_model_dir), lineage="l1", stall_snapshot_s=600)  # fmt: skip
        await announcer.announce(6)
        stop = asyncio.Event()
        running = asyncio.create_task(actor.run(stop))
        await _until(lambda: vllm_engine.version == 6, "never reached v6 from the store")
        log = actor.weights.weights_log
        assert log.num_deltas_applied == 2  # snapshot v4 + 5 + 6
        await _holds(vllm_engine, commands, str(log.held.path))

        await asyncio.to_thread(_step, commands)  # v7: from our own v6, one delta
        await announcer.announce(7)
        await _until(lambda: vllm_engine.version == 7, "never followed v7")
        assert log.num_deltas_applied == 3
        await _holds(vllm_engine, commands, str(log.held.path))
        assert actor.weights._follower is None  # no broadcast joined, ever
        stop.set()
        await running
    finally:
        await nc.close()
        commands.stop()
