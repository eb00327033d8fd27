"""A test-only rollout actor: the real bus protocol, no model.

It pulls PromptTasks from the work queue, waits until its "loaded" version reaches the
task's `min_version` (following the learner's policy version in the NATS KV, every change
including a step back after a learner resume), "generates" for `delay_s`, and publishes the
group: prompt tokens (loss mask 0), two assistant turns of policy tokens (loss mask 1,
behaviour logprob -1.0, tagged with the loaded version) around an observation (mask 0),
rewards that vary within the group (with `flat_every` k, every k-th training group it
plays has one reward for all: no signal). Trajectories are made by the real actor's
`actors.trajectory.to_trajectory`, so a retried publish is stored once.

`lag` makes a laggard: its loaded version is the announced one minus `lag` (an actor whose
weight updates arrive late; it has no weights while that is negative). It still honours
`min_version`, so it waits until `announced - lag >= min_version`; with
`lag > max_staleness` every group it publishes is certainly too stale by the time the
learner sees it (the learner's version is at least the announced one the actor read).
Near the end of a run the version it waits for may never come: with `patience_s` it hands
such a task back (nak) for another replica to take.

Everything it does is logged (`seen`, `published`) for the tests to check against the
learner's history.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field

import nats.errors

from actors.trajectory import to_trajectory
from actors.types import EpisodeResult
from broker import client
from broker.names import BusNames
from broker.retry import until_done
from broker.wire import PromptTask, Trajectory

VOCAB_LOW, VOCAB_HIGH = 5, 400  # token ids the tiny model's vocabulary (464) holds


@dataclass(frozen=True)
class SeenTask:
    task_id: str
    min_version: int
    is_eval: bool
    announced_at_receipt: int
    """The KV's version read right after the task arrived."""
    loaded_at_receipt: int
    """The actor's own version when the task arrived (announced - lag, as last seen)."""


@dataclass(frozen=True)
class PublishedGroup:
    group_id: str
    step: int
    min_version: int
    is_eval: bool
    version: int
    """The version its policy tokens carry."""
    announced_at_publish: int
    """The KV's version read just before publishing: the learner is at least here."""
    trajectory_ids: tuple[str, ...]
    published_at: float = 0.0
    """time.monotonic() when the stream had stored all of it."""
    flat: bool = False
    """Every sample got the same reward (no signal)."""
    max_staleness: int = -1
    """The bound its task was released under (the learner trains it by that)."""


RESUMABLE = {"patience_s": 2.0}
"""For runs that kill the learner: a task the lost run released for a version the resumed
learner has not reached is handed back after 2 s, as a real replica does after
`actor.version_wait_s`. Without it, both actors (one task at a time each) can hold such
tasks while the learner waits for the groups queued behind them: a stall with no end."""


@dataclass
class ScriptedActor:
    url: str
    names: BusNames
    actor_id: str
    delay_s: float = 0.0
    lag: int = 0
    patience_s: float | None = None
    """Hand a task back (nak) when the weights it needs have not come within this long."""
    seed: int = 0
    flat_every: int = 0
    """Every k-th training group gets one reward for all its samples (0: none does)."""
    first_turn_lag: int = 0
    """Each episode's first turn is labelled this many versions older than its second (an
    episode that spanned weight updates), never below version 0."""
    conversations: int = 1
    """Conversations per episode: more than one is an agent episode of several (a solver and
    a critic), each after the first marked in `segment_starts`."""
    seen: list[SeenTask] = field(default_factory=list)
    published: list[PublishedGroup] = field(default_factory=list)
    handed_back: list[str] = field(default_factory=list)

    def stop(self) -> None:
        """Make `run` return at its next poll. Cancelling alone is not enough: Python 3.11's
        `asyncio.wait_for` can swallow a cancellation that lands as the awaited request
        finishes (nats-py's fetch and KV get use it), and these loops poll every 0.2 s."""
        self._stopping = True

    async def run(self) -> None:
        """Serve tasks until stopped (`stop()`, then cancel)."""
        self._stopping = False
        self._rng = random.Random(self.seed)
        self.nc = await client.connect(self.url, name=self.actor_id)
        js = self.nc.jetstream()
        self.policy = client.PolicyStore(js, self.names)
        puller = client.PromptPuller(js, self.names)
        self.publisher = client.TrajectoryPublisher(js, self.names)
        self.announced = await self._read_announced()
        self._changed = asyncio.Event()
        follower = asyncio.create_task(self._follow())
        try:
            while not self._stopping:
                # As the real actor: a broker restart is waited out, not fatal.
                try:
                    batch = await puller.fetch(batch=1, timeout_s=0.2)
                except nats.errors.Error:
                    await asyncio.sleep(0.2)
                    continue
                for received in batch:
                    await self._serve(received)
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            await self.nc.close()

    @property
    def loaded(self) -> int:
        """The version of the weights it generates with (negative: none yet, it waits)."""
        return self.announced - self.lag

    async def _read_announced(self) -> int:
        version = await self.policy.get()
        return -1 if version is None else version.version

    async def _follow(self) -> None:
        """Track every change of the announced version (a poll: it may also go down)."""
        while not self._stopping:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                announced = await self._read_announced()
                if announced != self.announced:
                    self.announced = announced
                    self._changed.set()
            await asyncio.sleep(0.02)

    async def _serve(self, received: client.ReceivedPrompt) -> None:
        task = received.task
        self.seen.append(
            SeenTask(
                task_id=task.task_id,
                min_version=task.min_version,
                is_eval=task.is_eval,
                # A task taken just before the broker went away (the restart test): the
                # read waits out the restart, as the real actor's bus calls do.
                announced_at_receipt=await until_done(self._read_announced, "the version"),
                loaded_at_receipt=self.loaded,
            )
        )
        heartbeat = asyncio.create_task(self._heartbeat(received))
        deadline = time.monotonic() + (self.patience_s or float("inf"))
        try:
            while self.loaded < task.min_version:
                if time.monotonic() > deadline:
                    self.handed_back.append(task.task_id)
                    await received.nak(0.5)  # let another replica take it
                    return
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=0.2)
            version = self.loaded
            await asyncio.sleep(self.delay_s)
            flip = self._rng.randrange(2)
            played = sum(not g.is_eval for g in self.published) + 1
            flat = not task.is_eval and self.flat_every > 0 and played % self.flat_every == 0
            group = [
                self._trajectory(task, i, version, reward=1.0 if flat else float((i + flip) % 2))
                for i in range(task.group_size)
            ]
            announced = await self._read_announced()
            await self.publisher.publish_many(group)
            self.published.append(
                PublishedGroup(
                    group_id=task.task_id,
                    step=task.step,
                    min_version=task.min_version,
                    is_eval=task.is_eval,
                    version=version,
                    announced_at_publish=announced,
                    trajectory_ids=tuple(t.trajectory_id for t in group),
                    published_at=time.monotonic(),
                    flat=flat,
                    max_staleness=task.max_staleness,
                )
            )
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await received.ack()  # lost: redelivered, and deduplicated by trajectory id
        except asyncio.CancelledError:
            with contextlib.suppress(nats.errors.Error):
                await received.nak(0)  # hand it back now, not after the ack wait
            raise
        finally:
            heartbeat.cancel()

    async def _heartbeat(self, received: client.ReceivedPrompt) -> None:
        while True:
            await asyncio.sleep(2.0)
            with contextlib.suppress(nats.errors.Error):
                await received.in_progress()

    def _trajectory(
        self, task: PromptTask, sample_index: int, version: int, *, reward: float
    ) -> Trajectory:
        rng = self._rng
        prompt = [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(rng.randrange(8, 16))]
        turn1 = [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(rng.randrange(3, 8))]
        observation = [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(4)]
        turn2 = [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(rng.randrange(2, 6))]
        result = EpisodeResult(
            prompt_len=len(prompt), reward=reward, stop_reason="stop", num_turns=2, num_tool_calls=1
        )
        result.append(prompt)
        first = max(0, version - self.first_turn_lag)
        result.append(turn1, logprobs=[-1.0] * len(turn1), versions=[first] * len(turn1))
        result.append(observation)
        result.append(turn2, logprobs=[-1.0] * len(turn2), versions=[version] * len(turn2))
        for _ in range(self.conversations - 1):  # another agent's conversation: its own prompt
            result.segment_starts.append(len(result.token_ids))
            result.append([rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(6)])
            reply = [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(rng.randrange(2, 6))]
            result.append(reply, logprobs=[-1.0] * len(reply), versions=[version] * len(reply))
            result.num_turns += 1
        return to_trajectory(result, task=task, sample_index=sample_index, actor_id=self.actor_id)


def resumable_pair(url: str, names: BusNames) -> list[ScriptedActor]:
    """A fast and a slower actor, RESUMABLE: the pair of the runs that kill the learner."""
    return [
        ScriptedActor(url, names, actor_id="a", delay_s=0.02, seed=7, **RESUMABLE),
        ScriptedActor(url, names, actor_id="b", delay_s=0.15, seed=8, **RESUMABLE),
    ]
