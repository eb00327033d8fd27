"""A replica that joins late loads the newest weights snapshot from the bucket: the learner's
uploader puts it there (verified) and announces its s3:// URL; the actor downloads it,
checks it against the manifest and hands the engine a local directory. Real moto S3
server and nats-server; a scripted engine that reads the safetensors it is given."""

from __future__ import annotations

import asyncio

import pytest
import torch

from actors.actor import Actor
from actors.chat import ChatTemplate
from actors.config import ActorConfig
from actors.snapshots import SnapshotSource
from broker import client as bus
from broker.config import BrokerConfig
from broker.wire import PolicyVersion
from demo.tokenizer import build_tokenizer
from learner.artifacts import open_artifacts
from tests.fakes import InProcessEnv, ScriptedEngine, by_turn
from weights.actor_side.follower import WeightUpdateError
from weights.formats.snapshot import safetensors_weights, write_snapshot


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(num_conversations=200)


class ReadingEngine(ScriptedEngine):
    """Loads a snapshot for real: reads every tensor of the directory it is given."""

    loaded: dict[str, torch.Tensor] | None = None

    async def load_snapshot(self, path: str, version: int) -> float:
        self.loaded = dict(safetensors_weights(path))
        return await super().load_snapshot(path, version)


def _upload_snapshots(storage, tmp_path) -> tuple[dict[str, torch.Tensor], str]:
    """The learner's side: snapshots v5 and v10 written and queued (the newest wins a queued
    slot); returns v10's tensors and the URL the learner announces once it is up."""
    sync = open_artifacts(
        storage, run_name="late", checkpoint_root=tmp_path / "ckpt", keep_local=1, resume=False
    )
    for version in (5, 10):
        torch.manual_seed(version)
        named = {"w": torch.randn(32, 16), "b": torch.randn(16)}
        path = write_snapshot(tmp_path / "weights", version, named.items())
        sync.snapshot_written(path, version)
    assert sync.close(timeout_s=60) and sync.num_failures == 0
    url, version = sync.announced_snapshot((path, 10))
    assert version == 10 and url.startswith(f"s3://{storage.bucket}/tether/late/weights/")
    return named, url


async def test_a_late_replica_loads_the_newest_snapshot_from_the_bucket(
    s3_storage, tokenizer, nats_server, bus_names, tmp_path
):
    storage = s3_storage(cache_dir=str(tmp_path / "cache"))
    named, url = await asyncio.to_thread(_upload_snapshots, storage, tmp_path)
    broker = BrokerConfig(
        url=nats_server.url, namespace=bus_names.namespace, max_trajectory_bytes=16 * 1024**2
    )
    config = ActorConfig.model_validate(
        dict(engine={"model": "unused"}, metrics_port=0, fetch_timeout_s=0.2, drain_timeout_s=0)
    )
    engine = ReadingEngine(tokenizer, by_turn("<answer>1</answer>"))
    actor = Actor(
        config=config,
        broker=broker,
        engine=engine,
        env=InProcessEnv(),
        chat=ChatTemplate(tokenizer),
        actor_id="late",
        snapshots=SnapshotSource(storage),
    )
    nc = await bus.connect(broker.url, name="test")
    try:
        js = nc.jetstream()
        await bus.ensure_streams(js, broker.names, broker.stream_limits())
        await bus.PolicyStore(js, broker.names).publish(
            PolicyVersion(version=12, published_at=0.0, snapshot_path=url, snapshot_version=10)
        )
        stop = asyncio.Event()
        running = asyncio.create_task(actor.run(stop))
        deadline = asyncio.get_running_loop().time() + 30
        while engine.version != 10:
            assert asyncio.get_running_loop().time() < deadline, "the snapshot never loaded"
            await asyncio.sleep(0.05)
        stop.set()
        await running
    finally:
        await nc.close()
    assert engine.version == 10
    ((path, version),) = engine.snapshots_loaded
    assert version == 10 and path.startswith(str(tmp_path / "cache"))
    assert engine.loaded.keys() == named.keys()
    for name, tensor in named.items():
        assert torch.equal(engine.loaded[name], tensor), name


async def test_without_a_storage_section_an_s3_snapshot_is_refused_not_fatal():
    with pytest.raises(WeightUpdateError, match="no \\[storage\\] section"):
        await SnapshotSource(None).local_path("s3://bucket/p/r/weights/global_step_1/", 1)
    assert await SnapshotSource(None).local_path("/snap/v1", 1) == "/snap/v1"
