"""Replicas as real processes (actors/replicas.py) on the fake engine and env: a replica
killed (SIGKILL) in the middle of a group loses nothing and duplicates nothing — another
replica completes the group after the broker's ack wait, and the samples the dead one had
already published are deduplicated by trajectory id."""

from __future__ import annotations

import asyncio
import time

import nats.js.errors
import pytest

from actors.replicas import LocalProcesses, ReplicaSpec, supervise
from broker import client as bus
from broker.wire import PromptTask
from common.supervision import Events, RestartPolicy, read_events
from demo.data import SYSTEM_PROMPT
from tests.fakes import FakeReplicaHandle
from tests.restart_events import killed_and_restarted

FAKE_TARGET = "tests.fakes:fake_replica_main"
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
ANSWER = "<answer>42</answer>"
ACK_WAIT_S = 3.0


@pytest.fixture
def config_path(tmp_path, nats_server, bus_names):
    path = tmp_path / "actor.toml"
    path.write_text(
        f"""
[broker]
url = "{nats_server.url}"
namespace = "{bus_names.namespace}"
prompt_ack_wait_s = {ACK_WAIT_S}
max_trajectory_bytes = 67108864

[actor]
heartbeat_s = 0.5
fetch_timeout_s = 0.2
drain_timeout_s = 0.0
metrics_port = 0
log_level = "WARNING"
sampling = {{ seed = 0 }}
engine = {{ model = "unused-by-fakes" }}
"""
    )
    return str(path)


@pytest.fixture
async def js(nats_server, bus_names):
    nc = await bus.connect(nats_server.url, name="test")
    js = nc.jetstream()
    yield js
    await nc.close()


def _spec(config_path, index, **extra) -> ReplicaSpec:
    return ReplicaSpec(
        index=index,
        config_path=config_path,
        target=FAKE_TARGET,
        extra={"replies": [TOOL_CALL, ANSWER], **extra},
    )


async def _until(predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_replica_killed_mid_group_is_replaced_without_loss_or_duplicates(
    config_path, js, bus_names
):
    launcher = LocalProcesses()
    # Samples 2 and 3 (seeds 2, 3) of replica A never finish: it dies holding them.
    doomed = launcher.start(
        _spec(config_path, 0, actor_id="A", delay_for_seed={"2": 600.0, "3": 600.0})
    )
    survivor = None
    try:
        await _until(lambda: _streams_exist(js, bus_names), timeout_s=60)
        task = PromptTask(
            task_id="kill-1",
            step=0,
            group_size=4,
            env_class="calculator",
            prompt=[
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": "What is 17 + 25?"},
            ],
            reward_spec={"ground_truth": "42"},
        )
        await bus.publish_prompts(js, bus_names, [task])

        async def two_published():
            return await _count(js, bus_names.trajectories.stream) >= 2

        await _until(two_published, timeout_s=60)
        doomed.kill()
        doomed.join(10)
        assert await _count(js, bus_names.trajectories.stream) == 2

        survivor = launcher.start(_spec(config_path, 1, actor_id="B"))

        async def prompt_done():
            return await _count(js, bus_names.prompts.stream) == 0

        await _until(prompt_done, timeout_s=60 + ACK_WAIT_S)
    finally:
        for handle in (doomed, survivor):
            if handle is not None and handle.alive:
                handle.terminate()
                handle.join(20)
                if handle.alive:
                    handle.kill()

    consumer = bus.TrajectoryConsumer(js, bus_names)
    received = []
    for _ in range(5):
        received += await consumer.fetch(batch=16, timeout_s=0.3)
    trajectories = sorted((r.trajectory for r in received), key=lambda t: t.sample_index)
    assert [t.trajectory_id for t in trajectories] == [f"kill-1/{i}" for i in range(4)]
    assert [t.actor_id for t in trajectories] == ["A", "A", "B", "B"]
    assert [t.reward for t in trajectories] == [1.0] * 4
    assert survivor.exitcode == 0  # SIGTERM: drained and exited cleanly


async def _streams_exist(js, names) -> bool:
    """Both streams the tests use are there (the replica creates them one after the other:
    the trajectories' may still be missing when the prompts' exists)."""
    try:
        await js.stream_info(names.prompts.stream)
        await js.stream_info(names.trajectories.stream)
        return True
    except nats.js.errors.NotFoundError:  # not created yet by the replica
        return False


async def _count(js, stream: str) -> int:
    return (await js.stream_info(stream)).state.messages


class _ScriptedLauncher:
    """Replica 0 crashes on its first start; replica 1 runs until stopped."""

    def __init__(self):
        self.starts = []

    def start(self, spec):
        self.starts.append(spec.index)
        crashed = spec.index == 0 and self.starts.count(0) == 1
        return FakeReplicaHandle(spec, 1 if crashed else None)


def test_supervisor_restarts_a_crashed_replica_and_stops_the_rest():
    launcher = _ScriptedLauncher()
    specs = [ReplicaSpec(index=i, config_path=None) for i in range(2)]
    polls = []

    def should_stop():
        polls.append(1)
        return len(polls) > 5

    code = supervise(
        launcher,
        specs,
        should_stop=should_stop,
        policy=RestartPolicy(initial_backoff_s=0.0),
        poll_s=0,
    )
    assert code == 0
    assert launcher.starts == [0, 1, 0]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read() != b""  # a zombie has no command line
    except FileNotFoundError:
        return False


def test_killed_replica_takes_its_engine_with_it_and_is_restarted(tmp_path):
    """vLLM's engine process does not notice its client's death: the supervisor must stop it
    (the replica's own process group), or every replica kill leaks an engine."""
    import os
    import signal
    import threading

    pid_file = tmp_path / "engine.pid"
    spec = ReplicaSpec(
        index=0,
        config_path=None,
        target="tests.fakes:engine_leaving_replica_main",
        extra={"pid_file": str(pid_file)},
    )
    launcher = LocalProcesses()
    started = []
    real_start = launcher.start
    launcher.start = lambda s: started.append(real_start(s)) or started[-1]
    stop = threading.Event()
    result = []
    thread = threading.Thread(
        target=lambda: result.append(
            supervise(
                launcher,
                [spec],
                should_stop=stop.is_set,
                policy=RestartPolicy(initial_backoff_s=0.0),
                events=Events(tmp_path / "events.jsonl"),
                role="actor",
                poll_s=0.05,
                stop_timeout_s=5,
            )
        )
    )
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline, "the replica never started its engine"
            time.sleep(0.05)
        engine = int(pid_file.read_text())
        pid_file.unlink()
        assert os.getpgid(started[0].pid) == started[0].pid  # a group of its own
        os.kill(started[0].pid, signal.SIGKILL)
        while len(started) < 2 or _alive(engine):
            assert time.monotonic() < deadline, "engine left behind or replica not restarted"
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(30)
    assert result == [0]  # the restarted replica stopped on SIGTERM
    assert not started[1].alive
    assert killed_and_restarted(read_events(tmp_path), "actor/replica-0") == (started[0].pid, -9)
