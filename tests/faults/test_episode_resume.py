"""An actor replica SIGKILLed mid-episode (issue 33): real parts only — a nats-server, the
calculator env server with a slow tool (every call waits ~1.5 s, so an episode spans
seconds), `actor --replicas 2` with real vLLM engines on the shipped warm-start model (it
calls the `add` tool). The test publishes prompt tasks as the dispatcher does, watches the
episode checkpoints the replicas record in the broker, and kills the replica that recorded
the first one. Its task comes back after the ack wait; each of its unfinished samples must
continue on another replica from its last recorded turn (counted in the trajectory), and
its trajectory must begin with exactly the tokens, logprobs, loss mask and versions the
dead replica generated."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from broker import client as bus
from broker.codec import decode, token_arrays
from broker.wire import EpisodeCheckpoint, PromptTask
from common.procs import free_port
from demo.data import SYSTEM_PROMPT
from demo.tinymodel import shipped_model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
GROUP_SIZE = 4
QUESTIONS = ["What is 17 + 25?", "What is 230 + 112?"]
ACK_WAIT_S = 4.0


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args], cwd=REPO, env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def _task(index: int, question: str) -> PromptTask:
    a, b = (int(x) for x in question.removeprefix("What is ").rstrip("?").split(" + "))
    return PromptTask(
        task_id=f"resume-test/{index}",
        step=0,
        group_size=GROUP_SIZE,
        env_class="calculator",
        data_source="calculator",
        prompt=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question},
        ],
        reward_spec={"method": "rule", "ground_truth": str(a + b)},
    )


class _Watch:
    """Every checkpoint the replicas record; kills the replica of the first one that has a
    turn (its pid ends its actor id), and keeps the last checkpoint of each sample it
    recorded (what it had generated when it died)."""

    def __init__(self) -> None:
        self.killed: str | None = None
        self.last_of_killed: dict[tuple[str, int], EpisodeCheckpoint] = {}

    async def run(self, kv) -> None:
        watcher = await kv.watchall()
        while True:
            entry = await watcher.updates(timeout=600)
            if entry is None or not entry.value:
                continue
            saved = decode(entry.value, EpisodeCheckpoint)
            if self.killed is None and not saved.stored and saved.num_turns >= 1:
                # At once: the episode's next turn and its answer take well under a second.
                self.killed = saved.actor_id
                os.kill(int(saved.actor_id.rsplit("-", 1)[1]), signal.SIGKILL)
            if saved.actor_id == self.killed:
                key = (saved.task_id, saved.sample_index)
                if saved.stored:
                    self.last_of_killed.pop(key, None)  # it finished before it died
                else:
                    self.last_of_killed[key] = saved


async def test_a_killed_replicas_episodes_continue_from_their_last_turn(
    nats_server, bus_names, tmp_path
):
    env_port = free_port()
    env = _start(
        ["envservers.cli", "--env", "calculator", f"envserver.port={env_port}",
         "envserver.metrics_port=0", "envserver.calculator.latency_median_s=1.5",
         "envserver.calculator.latency_p99_s=2.0", "envserver.calculator.latency_seed=0"],
        tmp_path / "envserver.log",
    )  # fmt: skip
    actor = _start(
        ["actors.cli", "--config", "configs/demo.toml", "--replicas", "2",
         f"actor.engine.model={shipped_model_dir()}", "actor.metrics_port=0",
         f'actor.env.addresses=["127.0.0.1:{env_port}"]', "actor.heartbeat_s=1",
         f"broker.url={nats_server.url}", f"broker.namespace={bus_names.namespace}",
         f"broker.prompt_ack_wait_s={ACK_WAIT_S}", "broker.max_trajectory_bytes=67108864"],
        tmp_path / "actor.log",
    )  # fmt: skip
    nc = await bus.connect(nats_server.url, name="test")
    watch = _Watch()
    try:
        js = nc.jetstream()
        limits = bus.StreamLimits(prompt_ack_wait_s=ACK_WAIT_S, max_trajectory_bytes=64 << 20)
        await bus.ensure_streams(js, bus_names, limits)
        watching = asyncio.create_task(watch.run(await js.key_value(bus_names.episodes_bucket)))
        tasks = [_task(i, q) for i, q in enumerate(QUESTIONS)]
        await bus.publish_prompts(js, bus_names, tasks)
        consumer, stored = bus.TrajectoryConsumer(js, bus_names), {}
        async with asyncio.timeout(600):
            while len(stored) < GROUP_SIZE * len(tasks):
                assert actor.poll() is None, (tmp_path / "actor.log").read_text()[-3000:]
                for received in await consumer.fetch(16, timeout_s=1.0):
                    stored[received.trajectory.trajectory_id] = received.trajectory
                    await received.ack()
        watching.cancel()
    finally:
        await nc.close()
        _stop(actor)
        _stop(env)

    assert watch.killed is not None, "no episode recorded a turn"
    assert watch.last_of_killed, "the killed replica had no unfinished episode"
    # A sample stored in the instant between its publish and its mark was not lost.
    continued = {
        f"{t}/{i}" for t, i in watch.last_of_killed if stored[f"{t}/{i}"].actor_id != watch.killed
    }
    resumed = [stored[tid] for tid in sorted(continued)]
    report = {
        "samples_continued": len(resumed),
        "turns_resumed": sum(t.resumed_turns for t in resumed),
        "tokens_saved": sum(t.resumed_tokens for t in resumed),
        "tokens_generated_after": sum(
            int(np.count_nonzero(token_arrays(t).versions >= 0)) - t.resumed_tokens for t in resumed
        ),
    }
    print("RESUME-REPORT", report, flush=True)
    for (task_id, index), saved in watch.last_of_killed.items():
        trajectory = stored[f"{task_id}/{index}"]
        if trajectory.trajectory_id not in continued:
            continue
        assert trajectory.resumed_turns == saved.num_turns >= 1, trajectory
        assert trajectory.num_turns > saved.num_turns
        ours, recorded = token_arrays(trajectory), token_arrays(saved)
        n = len(recorded.token_ids)
        assert trajectory.resumed_tokens == int(np.count_nonzero(recorded.versions >= 0))
        for name in ("token_ids", "logprobs", "loss_mask", "versions"):
            assert np.array_equal(getattr(ours, name)[:n], getattr(recorded, name)), name
    # Nothing else was resumed: every other sample was played whole by one replica.
    assert continued and continued == {tid for tid, t in stored.items() if t.resumed_turns}
