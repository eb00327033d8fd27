"""The actor's weight-follow path against the learner's side of the weights, all real parts:
a nats-server, the actor loop (`actors.actor.Actor`) on the session's vLLM engine and a
gRPC calculator env server, and a learner stand-in made of what the learner itself uses —
`WeightSender.broadcast` of a perturbed tiny model, a safetensors snapshot laid out as
`learner/trainer/ranks.py` writes it, and `PolicyStore.publish(PolicyVersion(...))` — in the
learner's order: broadcast, then announce, then release prompts.

Checked: tokens generated after version v is broadcast and announced carry v; a task with
`min_version = v` waits until the engine has v; greedy output after an update equals
transformers' greedy output of the new weights; a late replica loads the announced snapshot
before it generates anything, then joins the next broadcast round.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from pathlib import Path

import numpy as np
import prometheus_client
import pytest
import torch

from actors.actor import Actor
from actors.chat import ChatTemplate
from actors.config import ActorConfig
from broker import client as bus
from broker.codec import token_arrays
from broker.config import BrokerConfig
from broker.wire import PolicyVersion, PromptTask, Trajectory
from demo.data import SYSTEM_PROMPT
from demo.reference import hf_greedy as _hf_greedy
from envservers.config import EnvServerConfig
from envservers.server import EnvServer
from protos.client import EnvClient, GrpcEnvConnector
from weights.config import WeightSyncConfig
from weights.learner_side.sender import BroadcastReport, WeightSender

pytestmark = pytest.mark.vllm

MAX_TOKENS = 24
SNAPSHOT_FILE = "model.safetensors"  # learner/trainer/ranks.py SNAPSHOT_FILE


# ---- the learner's side, from its real parts ---------------------------------------------------


class LearnerStandIn:
    """What the learner does after each optimizer step (learner/loop.py `_train`):
    `RankCommands.publish_weights` (snapshot every `snapshot_interval`, then
    `WeightSender.broadcast`), then `_announce` (PolicyVersion in the KV)."""

    def __init__(self, js, broker: BrokerConfig, run_dir: Path) -> None:
        self.sender = WeightSender(
            WeightSyncConfig(
                store_port=0, backend="gloo", join_timeout_s=10.0, transfer_timeout_s=30.0
            )
        )
        self.policy = bus.PolicyStore(js, broker.names)
        self.snapshot_dir = run_dir / "weights"
        self.snapshot: tuple[Path, int] | None = None

    @property
    def broadcast_addr(self) -> str:  # RankCommands.broadcast_addr
        return f"{self.sender.config.store_host}:{self.sender.config.store_port}"

    async def announce(self, version: int) -> None:
        await self.policy.publish(
            PolicyVersion(
                version=version,
                published_at=time.time(),
                snapshot_path=str(self.snapshot[0]) if self.snapshot else "",
                snapshot_version=self.snapshot[1] if self.snapshot else -1,
                broadcast_addr=self.broadcast_addr,
            )
        )

    def write_snapshot(self, version: int, named: list[tuple[str, torch.Tensor]]) -> None:
        """`<run_dir>/weights/v<version:06d>/model.safetensors`, as RankCommands writes it."""
        from safetensors.torch import save_file

        directory = self.snapshot_dir / f"v{version:06d}"
        directory.mkdir(parents=True)
        save_file({n: t.detach().contiguous().cpu() for n, t in named}, directory / SNAPSHOT_FILE)
        self.snapshot = (directory, version)

    async def step(self, version: int, model, *, snapshot: bool = False) -> BroadcastReport:
        # The learner sends `named_parameters()` of the (FSDP) model: HF names, tied once.
        named = [(name, param.detach()) for name, param in model.named_parameters()]
        if snapshot:
            self.write_snapshot(version, named)
        report = await asyncio.to_thread(self.sender.broadcast, version, named)
        await self.announce(version)
        return report

    async def wait_for_members(self, count: int, timeout_s: float = 60.0) -> None:
        """Until `count` subscriptions are registered (a round before that misses them)."""
        deadline = time.monotonic() + timeout_s
        while sum(s == "alive" for s in self.sender.members().values()) < count:
            assert time.monotonic() < deadline, "the actor never subscribed to the broadcast"
            await asyncio.sleep(0.05)

    def close(self) -> None:
        self.sender.close()


# ---- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def broker(nats_server, bus_names) -> BrokerConfig:
    return BrokerConfig(
        url=nats_server.url,
        namespace=bus_names.namespace,
        prompt_ack_wait_s=30.0,
        max_trajectory_bytes=64 * 1024**2,
    )


@pytest.fixture
async def js(broker):
    nc = await bus.connect(broker.url, name="test-learner")
    js = nc.jetstream()
    await bus.ensure_streams(js, broker.names, broker.stream_limits())
    yield js
    await nc.close()


@pytest.fixture
async def env():
    server = EnvServer(EnvServerConfig(port=0, envs=["calculator"], metrics_port=None, drain_s=0))
    await server.start()
    async with EnvClient([server.address], timeout_s=10, max_retries=0) as client:
        yield GrpcEnvConnector(client)
    await server.stop(drain_s=0, grace_s=1)


@pytest.fixture
async def fresh_engine(vllm_engine, tiny_model_dir):
    """The session engine as a replica's engine is when it starts: the initial weights at
    version 0 (what `VllmEngine.start(config.engine)` gives), and so again afterwards."""
    await vllm_engine.load_snapshot(tiny_model_dir, 0)
    yield vllm_engine
    await vllm_engine.load_snapshot(tiny_model_dir, 0)


@pytest.fixture
async def learner(js, broker, tmp_path):
    stand_in = LearnerStandIn(js, broker, tmp_path / "run")
    yield stand_in
    stand_in.close()


# ---- helpers ------------------------------------------------------------------------------------


def _config(tiny_model_dir) -> ActorConfig:
    return ActorConfig.model_validate(
        dict(
            engine={"model": str(tiny_model_dir), "max_model_len": 1024},
            env={"backoff_s": 0.0},
            sampling={"temperature": 0.0},  # greedy: comparable with transformers
            rollout={
                "max_turns": 1,
                "max_generate_length": MAX_TOKENS,
                "max_input_length": 768,
                "max_sequence_length": 1024,
            },
            heartbeat_s=1.0,
            fetch_timeout_s=0.2,
            drain_timeout_s=10.0,
            metrics_port=0,
        )
    )


def _actor(engine, env, tokenizer, broker, tiny_model_dir, actor_id: str) -> Actor:
    return Actor(
        config=_config(tiny_model_dir),
        broker=broker,
        engine=engine,
        env=env,
        chat=ChatTemplate(tokenizer),
        actor_id=actor_id,
    )


@contextlib.asynccontextmanager
async def _running(actor: Actor):
    stop = asyncio.Event()
    task = asyncio.create_task(actor.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=60)


def _task(task_id: str, *, min_version: int = 0, group_size: int = 2) -> PromptTask:
    return PromptTask(
        task_id=task_id,
        step=max(min_version, 0),
        min_version=min_version,
        group_size=group_size,
        env_class="calculator",
        data_source="calculator",
        prompt=[
            {"role": "system", "content": SYSTEM_PROMPT},
            # The same prompt every time, as RL revisits prompts: an update must not let a new
            # request reuse prefix KV the old weights computed.
            {"role": "user", "content": "What is 17 + 25?"},
        ],
        reward_spec={"method": "rule", "ground_truth": "42"},
    )


class Collector:
    """The learner's trajectory consumer: gathers every trajectory, by group."""

    def __init__(self, js, broker: BrokerConfig) -> None:
        self.consumer = bus.TrajectoryConsumer(js, broker.names)
        self.by_group: dict[str, list[Trajectory]] = {}

    async def poll(self, timeout_s: float = 0.2) -> None:
        for received in await self.consumer.fetch(batch=64, timeout_s=timeout_s):
            self.by_group.setdefault(received.trajectory.group_id, []).append(received.trajectory)
            await received.ack()

    async def group(self, group_id: str, size: int = 2, timeout_s: float = 120.0):
        deadline = time.monotonic() + timeout_s
        while len(self.by_group.get(group_id, [])) < size:
            assert time.monotonic() < deadline, f"group {group_id} never arrived"
            await self.poll()
        return sorted(self.by_group[group_id], key=lambda t: t.sample_index)


def _perturbed(model, *, seed: int, scale: float = 0.05):
    """A copy of `model` with Gaussian noise on every parameter: the next policy."""
    clone = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in clone.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    return clone


def _policy_versions(trajectory: Trajectory) -> set[int]:
    """Versions of the tokens a policy generated (-1 marks the prompt and observations; the
    loss mask cannot tell: overlong filtering zeroes it on a turn cut at max_tokens)."""
    arrays = token_arrays(trajectory)
    assert set(arrays.versions[: trajectory.prompt_len].tolist()) == {-1}
    return set(arrays.versions[arrays.versions != -1].tolist())


def _assert_greedy_of(model, trajectory: Trajectory, eos_id: int) -> None:
    """The first (only) assistant turn is what transformers' greedy decoder gives."""
    arrays = token_arrays(trajectory)
    prompt = arrays.token_ids[: trajectory.prompt_len].tolist()
    after_prompt = arrays.versions[trajectory.prompt_len :]
    not_policy = np.flatnonzero(after_prompt == -1)
    turn_len = int(not_policy[0]) if not_policy.size else after_prompt.size
    generated = arrays.token_ids[trajectory.prompt_len : trajectory.prompt_len + turn_len]
    assert generated.tolist() == _hf_greedy(model, prompt, MAX_TOKENS, eos_id)


def _metric(name: str, **labels) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


def _stalls(kind: str) -> tuple[float, float]:
    """(count, seconds) of weight-update stalls of `kind` recorded so far."""
    name = "tether_actor_weight_update_stall_seconds"
    return _metric(f"{name}_count", kind=kind), _metric(f"{name}_sum", kind=kind)


async def _stream_messages(js, stream: str) -> int:
    return (await js.stream_info(stream)).state.messages


# ---- tests --------------------------------------------------------------------------------------


async def test_actor_follows_broadcast_versions_and_gates_tasks_on_min_version(
    fresh_engine, env, tokenizer, broker, js, learner, hf_tiny_model, tiny_model_dir
):
    engine, eos = fresh_engine, tokenizer.eos_token_id
    names = broker.names
    collector = Collector(js, broker)
    stalls_before = _stalls("broadcast")
    waited_before = _metric("tether_actor_wait_seconds_total", what="weights")
    wire_before = [
        _metric(f"tether_actor_weight_{m}_total") for m in ("wire_seconds", "update_bytes")
    ]
    await learner.announce(0)  # learner start: version 0, the store's address, no snapshot
    # Released together: "early" may run on v0, "gated" only on v1 or newer.
    await bus.publish_prompts(
        js, names, [_task("early", min_version=0), _task("gated", min_version=1)]
    )
    actor = _actor(engine, env, tokenizer, broker, tiny_model_dir, "a0")
    async with _running(actor):
        await learner.wait_for_members(1)
        early = await collector.group("early")
        assert {v for t in early for v in _policy_versions(t)} == {0}
        for t in early:
            _assert_greedy_of(hf_tiny_model, t, eos)
        # The actor is busy and current; "gated" still waits for v1.
        await asyncio.sleep(1.0)
        await collector.poll()
        assert "gated" not in collector.by_group
        assert engine.version == 0
        info = await js.consumer_info(names.prompts.stream, names.prompts.consumer)
        assert info.num_ack_pending == 1  # held by the actor, waiting

        # Optimizer step 1: broadcast, then announce (the learner's order).
        policy_1 = _perturbed(hf_tiny_model, seed=11)
        started = time.monotonic()
        report_1 = await learner.step(1, policy_1)
        assert report_1.ok and report_1.num_receivers == 1 and report_1.missed == ()
        gated = await collector.group("gated")
        gated_latency_s = time.monotonic() - started
        assert engine.version == 1
        assert {v for t in gated for v in _policy_versions(t)} == {1}
        for t in gated:
            _assert_greedy_of(policy_1, t, eos)

        # Optimizer step 2, then the prompts it admits: generated on v2, nothing older.
        policy_2 = _perturbed(hf_tiny_model, seed=12)
        report_2 = await learner.step(2, policy_2)
        assert report_2.ok and report_2.num_receivers == 1
        await bus.publish_prompts(js, names, [_task("after-2", min_version=2)])
        after = await collector.group("after-2")
        assert {v for t in after for v in _policy_versions(t)} == {2}
        for t in after:
            _assert_greedy_of(policy_2, t, eos)
    assert actor.weights.newest_version == 2
    assert await _stream_messages(js, names.prompts.stream) == 0  # every task acked
    stalls = _stalls("broadcast")
    num_updates = stalls[0] - stalls_before[0]
    assert num_updates == 2
    waited_s = _metric("tether_actor_wait_seconds_total", what="weights") - waited_before
    assert waited_s >= 1.0  # "gated" sat out at least the second we watched it wait
    wire_s, wire_bytes = (
        _metric(f"tether_actor_weight_{m}_total") - before
        for m, before in zip(("wire_seconds", "update_bytes"), wire_before, strict=True)
    )
    assert 0 < wire_s < stalls[1] - stalls_before[1]  # streamed: on the wire within the stall
    assert 0 < wire_bytes <= report_1.num_bytes + report_2.num_bytes  # the tensors, no padding
    print(
        f"\nversions on tokens: early {{0}}, gated {{1}}, after-2 {{2}}; broadcasts "
        f"{report_1.num_bytes / 1e6:.1f} MB ({report_1.join_s * 1e3:.0f} ms join, "
        f"{report_1.transfer_s * 1e3:.0f} ms transfer) and "
        f"{report_2.join_s * 1e3:.0f} + {report_2.transfer_s * 1e3:.0f} ms; mean update stall "
        f"{(stalls[1] - stalls_before[1]) / num_updates * 1e3:.0f} ms; gated task waited "
        f"{waited_s:.1f} s, done {gated_latency_s:.1f} s after step 1 began"
    )


async def test_late_actor_loads_announced_snapshot_before_generating_then_follows(
    fresh_engine, env, tokenizer, broker, js, learner, hf_tiny_model, tiny_model_dir
):
    engine, eos = fresh_engine, tokenizer.eos_token_id
    names = broker.names
    collector = Collector(js, broker)
    snapshots_before = _stalls("snapshot")
    # The learner is at v3 with a snapshot of v3; nobody received round 3.
    policy_3 = _perturbed(hf_tiny_model, seed=13)
    report_3 = await learner.step(3, policy_3, snapshot=True)
    assert report_3.ok and report_3.num_receivers == 0
    # A prompt any version may run is already waiting when the new replica comes up.
    await bus.publish_prompts(js, names, [_task("first", min_version=0)])
    actor = _actor(engine, env, tokenizer, broker, tiny_model_dir, "late")
    async with _running(actor):
        first = await collector.group("first")
        # Generated on the snapshot, never on the engine's initial weights (version 0).
        assert {v for t in first for v in _policy_versions(t)} == {3}
        for t in first:
            _assert_greedy_of(policy_3, t, eos)
        snapshots = _stalls("snapshot")
        assert snapshots[0] == snapshots_before[0] + 1
        # ... and it joins the broadcast from the next round on.
        await learner.wait_for_members(1)
        policy_4 = _perturbed(hf_tiny_model, seed=14)
        report_4 = await learner.step(4, policy_4)
        assert report_4.ok and report_4.num_receivers == 1
        await bus.publish_prompts(js, names, [_task("next", min_version=4)])
        following = await collector.group("next")
        assert {v for t in following for v in _policy_versions(t)} == {4}
        for t in following:
            _assert_greedy_of(policy_4, t, eos)
    print(
        f"\nlate replica: snapshot v3 loaded in {(snapshots[1] - snapshots_before[1]) * 1e3:.0f}"
        f" ms before its first task; versions on tokens: first {{3}}, next {{4}}"
    )


async def test_replica_survives_an_announced_snapshot_that_is_gone(
    fresh_engine, env, tokenizer, broker, js, learner, hf_tiny_model, tiny_model_dir, caplog
):
    """The learner deletes the previous snapshot as it writes the next one, so a replica may
    read an announcement whose snapshot is already gone: it keeps its weights (and says
    so), serves what they admit, and catches up at the next round."""
    engine, eos = fresh_engine, tokenizer.eos_token_id
    collector = Collector(js, broker)
    learner.snapshot = (learner.snapshot_dir / "v000005", 5)  # announced, never on disk
    await learner.announce(5)
    await bus.publish_prompts(
        js, broker.names, [_task("now", min_version=0), _task("v6", min_version=6)]
    )
    actor = _actor(engine, env, tokenizer, broker, tiny_model_dir, "a2")
    async with _running(actor) as running:
        now = await collector.group("now")
        assert {v for t in now for v in _policy_versions(t)} == {0}
        for t in now:
            _assert_greedy_of(hf_tiny_model, t, eos)  # the initial weights, intact
        await learner.wait_for_members(1)
        policy_6 = _perturbed(hf_tiny_model, seed=16)
        report_6 = await learner.step(6, policy_6)
        assert report_6.ok and report_6.num_receivers == 1
        later = await collector.group("v6")
        assert {v for t in later for v in _policy_versions(t)} == {6}
        for t in later:
            _assert_greedy_of(policy_6, t, eos)
        assert not running.done()
    assert "weights snapshot v5 not loaded" in caplog.text
