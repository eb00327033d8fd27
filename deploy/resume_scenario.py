"""The episode-resume scenario (an episode continued by another replica from its last
turn), on real parts only, for the fault test (tests/faults/test_episode_resume.py) and
the benchmark (bench/episode_resume.py):

    nats-server, the calculator env server with a slow tool (each call waits ~1.5 s),
    `actor --replicas 2` with real vLLM engines on the shipped warm-start model (it calls
    the `add` tool), prompt tasks published as the dispatcher does.

The harness watches the episode checkpoints the replicas record in the broker and SIGKILLs
the replica that recorded the `kill_at`-th one with a turn (its pid ends its actor id). Its
tasks come back after the ack wait and are finished by the other replica. With SIGTERM
instead (a scale-in, a preemption notice, with `actor.drain_timeout_s` as the grace), the
replica leaves: each episode stops at its next turn boundary, checkpointed, and its task
comes back at once. With `forget`,
the dead replica's checkpoints are purged as it dies: its tasks are played as they were
before turn-level checkpoints existed (from their first token, stored samples again), the
baseline the benchmark compares with on the same work.

It lives in deploy/ beside deploy/chaos.py, the harness the fault suite's other runs and
`make soak` are built on: like it, it starts the roles as processes (on deploy/local.py's
ports) and hurts one. The fault test and the benchmark both run it from here, so what the
test holds to and what the benchmark measures is one scenario.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from broker import client as bus
from broker.codec import decode, token_arrays
from broker.names import BusNames
from broker.server import NatsServer
from broker.wire import EpisodeCheckpoint, PromptTask, Trajectory
from common.procs import free_port
from demo.data import make_row
from demo.tinymodel import shipped_model_dir
from deploy.local import free_port_block

REPO = Path(__file__).resolve().parents[1]
ACK_WAIT_S = 4.0
QUESTIONS = ["What is 4821 + 3907?", "What is 987 + 654?", "What is 230 + 112?"]
"""The warm start calls the tool for these in 78%, 50% and 41% of samples (32 each)."""


@dataclass
class Outcome:
    """What one run of the scenario saw."""

    stored: dict[str, Trajectory]
    """Every trajectory, by id."""
    killed: str
    """The actor id of the replica killed."""
    last_of_killed: dict[tuple[str, int], EpisodeCheckpoint]
    """The last checkpoint the killed replica recorded of each sample it had not stored."""
    stored_by_killed: set[tuple[str, int]]
    """Samples the killed replica had stored (marked) before it died."""
    seconds_to_done: float
    """From the kill until the last trajectory was stored."""
    survivor_generated_tokens: float
    """Policy tokens the other replica generated after the kill (its counter's increase)."""

    def continued(self) -> dict[str, Trajectory]:
        """Trajectories of the dead replica's unfinished samples, finished by another."""
        out = {}
        for task_id, index in self.last_of_killed:
            trajectory = self.stored[f"{task_id}/{index}"]
            if trajectory.actor_id != self.killed:  # else stored as it died: not lost
                out[trajectory.trajectory_id] = trajectory
        return out

    def figures(self) -> dict[str, float]:
        """Tokens the dead replica had generated that were generated again, and seconds."""
        continued = self.continued()
        lost = sum(  # what the dead replica had recorded of a sample played from scratch
            _policy_tokens(saved)
            for (task_id, index), saved in self.last_of_killed.items()
            if f"{task_id}/{index}" in continued
            and not continued[f"{task_id}/{index}"].resumed_turns
        )
        # With one task, everything the other replica generated after the kill was for the
        # dead one's task: the samples it stored, and whatever was generated again (samples
        # the dead replica had stored, played once more and deduplicated by the stream).
        new = sum(
            _policy_tokens(t) - t.resumed_tokens
            for t in self.stored.values()
            if t.actor_id != self.killed
        )
        duplicated = max(self.survivor_generated_tokens - new, 0.0)
        return {
            "samples_continued": len(continued),
            "samples_resumed": sum(t.resumed_turns > 0 for t in continued.values()),
            "turns_resumed": sum(t.resumed_turns for t in continued.values()),
            "tokens_saved": sum(t.resumed_tokens for t in continued.values()),
            "tokens_regenerated": lost + duplicated,
            "seconds_kill_to_done": self.seconds_to_done,
        }


def _policy_tokens(message) -> int:
    return int(np.count_nonzero(token_arrays(message).versions >= 0))


def calculator_task(task_id: str, question: str, group_size: int) -> PromptTask:
    """A task of the demo's own rows (demo/data.py: only the `add` tool offered, as the
    warm start was taught; offered all four, its prompt is one it never saw and it calls
    the tool far less often)."""
    a, b = (int(x) for x in question.removeprefix("What is ").rstrip("?").split(" + "))
    row = make_row(a, b, split="train")
    return PromptTask(task_id=task_id, step=0, group_size=group_size, **row)


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


def _generated_tokens(port: int) -> float:
    """tether_actor_generated_tokens_total of the replica serving /metrics on `port`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "tether_actor_generated_tokens":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


class _Watch:
    def __init__(self, kill_at: int, forget, metrics_port: int, signum: int) -> None:
        self.kill_at, self.forget, self.metrics_port = kill_at, forget, metrics_port
        self.signum = signum
        self.seen: set[tuple[str, int]] = set()
        self.killed: str | None = None
        self.killed_at = 0.0
        self.survivor_port = 0
        self.survivor_before = 0.0
        self.last_of_killed: dict[tuple[str, int], EpisodeCheckpoint] = {}
        self.stored_by_killed: set[tuple[str, int]] = set()

    async def run(self, kv) -> None:
        watcher = await kv.watchall()
        while True:
            entry = await watcher.updates(timeout=600)
            if entry is None or not entry.value:
                continue
            saved = decode(entry.value, EpisodeCheckpoint)
            key = (saved.task_id, saved.sample_index)
            if self.killed is None and not saved.stored and saved.num_turns >= 1:
                self.seen.add(key)
                if len(self.seen) >= self.kill_at:
                    await self._kill(saved.actor_id)
            if saved.actor_id == self.killed and self.killed:
                if saved.stored:
                    self.last_of_killed.pop(key, None)  # it finished before it died
                    self.stored_by_killed.add(key)
                else:
                    self.last_of_killed[key] = saved

    async def _kill(self, actor_id: str) -> None:
        replica = int(actor_id.rsplit("-", 2)[1].removeprefix("r"))  # host-r<i>-<pid>
        self.survivor_port = self.metrics_port + 1 - replica
        self.survivor_before = _generated_tokens(self.survivor_port)
        os.kill(int(actor_id.rsplit("-", 1)[1]), self.signum)
        self.killed, self.killed_at = actor_id, time.monotonic()
        if self.forget is not None:
            await asyncio.sleep(0.5)  # its last puts in flight land first
            await self.forget()


async def run_scenario(
    work_dir: Path,
    *,
    group_size: int,
    num_tasks: int = 1,
    kill_at: int = 1,
    forget=False,
    signum: int = signal.SIGKILL,
    grace_s: float = 10.0,
) -> Outcome:
    """Run the scenario once (a nats-server of its own under `work_dir`; the actor's log is
    `work_dir/actor.log`). `Outcome.figures` needs `num_tasks` 1: the other replica then
    works on the dead one's task alone. `grace_s`: the replicas' `actor.drain_timeout_s`,
    what a SIGTERMed one has to leave."""
    with NatsServer(work_dir / "nats") as nats:
        return await _run(
            nats.url, work_dir, group_size, num_tasks, kill_at, forget, signum, grace_s
        )


async def _run(url, work_dir, group_size, num_tasks, kill_at, forget, signum, grace_s) -> Outcome:
    env_port, metrics_port = free_port(), free_port_block(2)  # replica i on metrics_port + i
    env = _start(
        ["envservers.cli", "--env", "calculator", f"envserver.port={env_port}",
         "envserver.metrics_port=0", "envserver.calculator.latency_median_s=1.5",
         "envserver.calculator.latency_p99_s=2.0", "envserver.calculator.latency_seed=0"],
        work_dir / "envserver.log",
    )  # fmt: skip
    actor = _start(
        ["actors.cli", "--config", "configs/demo.toml", "--replicas", "2",
         f"actor.engine.model={shipped_model_dir()}", f"actor.metrics_port={metrics_port}",
         f'actor.env.addresses=["127.0.0.1:{env_port}"]', "actor.heartbeat_s=1",
         f"broker.url={url}", "broker.namespace=resume",
         f"broker.prompt_ack_wait_s={ACK_WAIT_S}", "broker.max_trajectory_bytes=67108864",
         f"actor.drain_timeout_s={grace_s}"],
        work_dir / "actor.log",
    )  # fmt: skip
    names = BusNames("resume")
    nc = await bus.connect(url, name="resume-scenario")
    try:
        js = nc.jetstream()
        limits = bus.StreamLimits(prompt_ack_wait_s=ACK_WAIT_S, max_trajectory_bytes=64 << 20)
        await bus.ensure_streams(js, names, limits)
        tasks = [calculator_task(f"resume/{i}", QUESTIONS[i], group_size) for i in range(num_tasks)]
        store = bus.EpisodeStore(js, names)

        async def purge() -> None:
            for task in tasks:
                await store.forget(task.task_id)

        watch = _Watch(kill_at, purge if forget else None, metrics_port, signum)
        watching = asyncio.create_task(watch.run(await js.key_value(names.episodes_bucket)))
        await bus.publish_prompts(js, names, tasks)
        stored = await _collect(bus.TrajectoryConsumer(js, names), group_size * num_tasks, actor)
        done_at = time.monotonic()
        watching.cancel()
        assert watch.killed is not None, "no episode recorded a turn"
        survivor = _generated_tokens(watch.survivor_port) - watch.survivor_before
    finally:
        await nc.close()
        _stop(actor)
        _stop(env)
    return Outcome(
        stored=stored,
        killed=watch.killed,
        last_of_killed=watch.last_of_killed,
        stored_by_killed=watch.stored_by_killed,
        seconds_to_done=done_at - watch.killed_at,
        survivor_generated_tokens=survivor,
    )


async def _collect(consumer, count: int, actor: subprocess.Popen) -> dict[str, Trajectory]:
    stored: dict[str, Trajectory] = {}
    async with asyncio.timeout(600):
        while len(stored) < count:
            if actor.poll() is not None:
                raise RuntimeError(f"the actor exited with {actor.returncode}")
            for received in await consumer.fetch(16, timeout_s=1.0):
                stored[received.trajectory.trajectory_id] = received.trajectory
                await received.ack()
    return stored
