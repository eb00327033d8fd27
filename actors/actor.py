"""One actor replica: pulls prompt tasks, plays each as a GRPO group on its engine against
the env servers, publishes every trajectory, and keeps its weights current.

Delivery rules (the bus is at-least-once; trajectory ids make it exactly-once in effect):
- A task is heart-beaten (`in_progress`) while its group runs, acked only after every
  trajectory of the group is stored by the stream, terminated when it can never succeed
  (malformed, prompt longer than max_input_length), and nak'd with a delay when this
  replica fails (so another one takes it). A replica that dies just stops heart-beating;
  the task comes back after the broker's ack wait.
- Trajectory ids are `<task_id>/<sample_index>` and go out as `Nats-Msg-Id`: a group
  re-played by another replica stores only the samples the first one had not published.
- Weights: a new replica loads the newest snapshot the learner announced, then joins
  every broadcast round (`weights.follower.BroadcastFollower`), or loads a snapshot of one
  it missed. A task runs once the engine's version is at least its `min_version`.
- Rollback: a learner that restarts announces a new lineage at its checkpoint's version.
  An engine holding newer weights (from the history the crash undid) reloads the announced
  snapshot: generating on it would tag tokens with versions the learner has not reached,
  and every group would be dropped as `future` until it had (a stall).

Engine and env connector are parameters: tests run the loop on fakes (tests/fakes.py),
`actors.replica.replica_main` builds the real ones."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import nats.errors

from actors import metrics
from actors.chat import ChatTemplate
from actors.config import ActorConfig
from actors.episode import Rollout, run_group, validate_task
from actors.snapshots import SnapshotSource
from actors.trajectory import to_trajectory
from actors.types import ActorEngine, EnvConnector, EpisodeResult
from broker import client as bus
from broker.config import BrokerConfig
from broker.wire import PolicyVersion, PromptTask
from protos.client import TaskRejected
from weights.follower import WeightUpdateError

log = logging.getLogger(__name__)


class WeightsBehind(Exception):
    """The engine cannot get the weights a task needs in time: hand the task back."""


class Actor:
    """The main loop of one replica. `await actor.run(stop)` until `stop` is set."""

    def __init__(
        self,
        *,
        config: ActorConfig,
        broker: BrokerConfig,
        engine: ActorEngine,
        env: EnvConnector,
        chat: ChatTemplate,
        actor_id: str,
        snapshots: SnapshotSource | None = None,
    ) -> None:
        if config.heartbeat_s >= broker.prompt_ack_wait_s:
            raise ValueError(
                f"actor.heartbeat_s ({config.heartbeat_s}) must be below "
                f"broker.prompt_ack_wait_s ({broker.prompt_ack_wait_s})"
            )
        self.config, self.broker = config, broker
        self.engine, self.env, self.chat = engine, env, chat
        self._generating = metrics.EngineBusyClock(engine)  # what episodes generate with
        self.actor_id = actor_id
        self.snapshots = snapshots or SnapshotSource()  # local paths, or s3:// downloads
        self.newest_version = -1
        self.num_published = 0
        self._version_changed = asyncio.Event()
        self._broadcast: asyncio.Task | None = None
        self._broadcast_addr = ""
        self._follower = None
        self._failure: BaseException | None = None
        self._stop = asyncio.Event()
        self._weights_started = False
        self._lineage: str | None = None
        self._announced: PolicyVersion | None = None
        self._catch_up_lock = asyncio.Lock()
        self.num_rollbacks = 0

    @property
    def ready(self) -> bool:
        """What /readyz reports (from the metrics server's thread): the engine runs, its
        start-up weights are settled, and it holds the newest announced version or follows
        the learner's broadcast. False while stopping."""
        if not self._weights_started or self._stop.is_set():
            return False
        return self._follower is not None or self.engine.version >= self.newest_version

    async def run(self, stop: asyncio.Event) -> None:
        """
        PolicyStore.follow ─► snapshot load / broadcast rounds ─► engine.version ──────┐
                                                                                      │
        prompt work queue ──fetch(free slots)──► one task per group (≤ max_groups):   │
                                                   wait engine.version ≥ min_version ◄┘
                                                   in_progress every heartbeat_s
                                                   run_group: n episodes ⇄ engine, env servers
                                                     each finished episode ─► publish (Msg-Id)
                                                   ack | term (rejected) | nak(delay)
        """
        nc = await bus.connect(self.broker.url, name=f"actor {self.actor_id}", tls=self.broker.tls)
        try:
            js = nc.jetstream()
            names = self.broker.names
            await bus.ensure_streams(js, names, self.broker.stream_limits())
            self.puller = bus.PromptPuller(js, names)
            self.publisher = bus.TrajectoryPublisher(js, names)
            self.policy = bus.PolicyStore(js, names)
            self._stop = stop
            await self._start_weights()
            follower = self._background(self._follow_policy())
            try:
                await self._serve(stop)
            finally:
                follower.cancel()
                await self._stop_weights()
        finally:
            await nc.close()
        if self._failure is not None:
            raise self._failure

    # ---- prompt tasks ------------------------------------------------------------------------

    async def _serve(self, stop: asyncio.Event) -> None:
        running: set[asyncio.Task] = set()
        stopping = asyncio.create_task(stop.wait())
        started = time.monotonic()
        while not stop.is_set():
            free = self.config.max_groups_in_flight - len(running)
            if free <= 0:
                await asyncio.wait({*running, stopping}, return_when=asyncio.FIRST_COMPLETED)
                continue
            started = time.monotonic()
            try:
                received = await self.puller.fetch(free, timeout_s=self.config.fetch_timeout_s)
            # Network boundary: the connection is re-establishing; pull again shortly.
            except nats.errors.Error as e:
                log.warning("pulling prompt tasks failed: %s", e)
                await asyncio.sleep(self.config.fetch_timeout_s)
                received = []
            metrics.WAIT_SECONDS.labels("prompts").inc(time.monotonic() - started)
            for item in received:
                task = asyncio.create_task(self._run_task(item, stop))
                running.add(task)
                task.add_done_callback(running.discard)
        stopping.cancel()
        if running:  # drain: let groups finish, then give the rest back at once
            _, unfinished = await asyncio.wait(running, timeout=self.config.drain_timeout_s)
            # Our last pull request lives on the server until it expires: a task nak'd
            # before then would be redelivered to it, i.e. to us, and sit out the ack wait.
            expired_at = started + self.config.fetch_timeout_s + 0.1
            await asyncio.sleep(max(expired_at - time.monotonic(), 0.0))
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)

    async def _run_task(self, received: bus.ReceivedPrompt, stop: asyncio.Event) -> None:
        task = received.task
        metrics.GROUPS_IN_FLIGHT.inc()
        unfinished = 0
        heartbeat = asyncio.create_task(self._heartbeat(received))

        async def publish(index: int, result: EpisodeResult) -> None:
            nonlocal unfinished
            unfinished -= 1
            metrics.EPISODES_IN_FLIGHT.dec()
            metrics.record_episode(task.env_class, result)
            trajectory = to_trajectory(
                result, task=task, sample_index=index, actor_id=self.actor_id
            )
            await self.publisher.publish(trajectory)
            self.num_published += 1
            metrics.TRAJECTORIES_PUBLISHED.inc()

        try:
            validate_task(task)
            await self._wait_for_version(task.min_version)
            unfinished = task.group_size
            metrics.EPISODES_IN_FLIGHT.inc(unfinished)
            sampling = self.config.eval_sampling if task.is_eval else self.config.sampling
            await run_group(
                Rollout(
                    engine=self._generating,
                    env=self.env,
                    chat=self.chat,
                    limits=self.config.rollout,
                    sampling=sampling,
                    env_config=self.config.env,
                ),
                task,
                on_result=publish,
            )
        except TaskRejected as e:
            metrics.TASKS.labels("rejected").inc()
            await _quietly(received.reject(str(e)), "terminate", task)
        except WeightsBehind as e:
            metrics.TASKS.labels("nacked").inc()
            log.warning("handing task %s back: %s", task.task_id, e)
            await _quietly(received.nak(self.config.nak_delay_s), "nak", task)
        except asyncio.CancelledError:
            # Shutting down: hand the task back now rather than after the ack wait.
            metrics.TASKS.labels("nacked").inc()
            await _quietly(received.nak(0), "nak", task)
            raise
        except Exception as e:
            # Not the task's fault and not the env's (those end episodes): the engine or
            # this process is broken. Give the task to another replica and stop this one;
            # the replica supervisor starts a fresh process.
            metrics.TASKS.labels("nacked").inc()
            await _quietly(received.nak(self.config.nak_delay_s), "nak", task)
            log.exception("task %s failed; stopping this replica", task.task_id)
            self._failure = self._failure or e
            stop.set()
        else:
            if await _quietly(received.ack(), "ack", task):
                metrics.TASKS.labels("acked").inc()
        finally:
            heartbeat.cancel()
            metrics.GROUPS_IN_FLIGHT.dec()
            metrics.EPISODES_IN_FLIGHT.dec(max(unfinished, 0))

    async def _heartbeat(self, received: bus.ReceivedPrompt) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            await _quietly(received.in_progress(), "heartbeat", received.task)

    def _background(self, coroutine) -> asyncio.Task:
        """A task that must run as long as the replica: if it fails, the replica stops
        (generating with weights nobody follows any more would go silently stale)."""
        task = asyncio.create_task(coroutine)

        def done(task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None:
                log.error("background task failed; stopping", exc_info=task.exception())
                self._failure = self._failure or task.exception()
                self._stop.set()

        task.add_done_callback(done)
        return task

    # ---- weights -----------------------------------------------------------------------------

    async def _start_weights(self) -> None:
        """Before the first generation: the newest snapshot, and the broadcast if any."""
        announced = await self.policy.get()
        if announced is not None:
            await self._on_policy(announced)
        self._record_versions()
        self._weights_started = True

    async def _follow_policy(self) -> None:
        async for announced in self.policy.follow():
            await self._on_policy(announced)

    async def _on_policy(self, announced: PolicyVersion) -> None:
        self._announced = announced
        if announced.lineage != self._lineage:
            rolled_back = self._lineage is not None and self.engine.version > announced.version
            self._lineage = announced.lineage
            self.newest_version = announced.version  # a resumed learner may be behind us
            if rolled_back:
                await self._roll_back(announced)
        self.newest_version = max(self.newest_version, announced.version)
        # While rounds keep the engine current, a snapshot load could race one and go back
        # a version: snapshots here serve replicas without a broadcast (and see `_missed`).
        if (
            self._broadcast is None
            and announced.snapshot_path
            and announced.snapshot_version > self.engine.version
        ):
            log.info("loading weights snapshot v%d", announced.snapshot_version)
            try:
                path = await self.snapshots.local_path(
                    announced.snapshot_path, announced.snapshot_version
                )
                stall_s = await self.engine.load_snapshot(path, announced.snapshot_version)
            # Unreadable (the learner rotated it away after announcing it): keep the weights
            # we have, as staged loads leave them; a broadcast or a newer snapshot follows.
            except WeightUpdateError as e:
                log.warning("weights snapshot v%d not loaded: %s", announced.snapshot_version, e)
            else:
                metrics.WEIGHT_UPDATE_STALL_SECONDS.labels("snapshot").observe(stall_s)
        if announced.broadcast_addr and announced.broadcast_addr != self._broadcast_addr:
            await self._stop_weights()  # a restarted learner serves a new store
            self._broadcast_addr = announced.broadcast_addr
            self._start_broadcast(announced.broadcast_addr)
        self._record_versions()

    async def _roll_back(self, announced: PolicyVersion) -> None:
        """The learner resumed below our weights' version: go back to its snapshot. The
        broadcast follower then joins the rounds after that version."""
        self.num_rollbacks += 1
        log.warning("the learner resumed at v%d (lineage %s), below this engine's v%d: "
                    "reloading snapshot v%d", announced.version, announced.lineage,
                    self.engine.version, announced.snapshot_version)  # fmt: skip
        if not announced.snapshot_path or announced.snapshot_version > announced.version:
            log.error("no snapshot at or below v%d to roll back to", announced.version)
            return
        try:
            stall_s = await self.engine.load_snapshot(
                announced.snapshot_path, announced.snapshot_version
            )
        # Unreadable: we keep the newer weights; their groups are dropped as `future` until
        # a broadcast round brings the learner's own.
        except WeightUpdateError as e:
            log.error("rollback snapshot v%d not loaded: %s", announced.snapshot_version, e)
            return
        metrics.WEIGHT_UPDATE_STALL_SECONDS.labels("snapshot").observe(stall_s)

    def _start_broadcast(self, address: str) -> None:
        from weights.follower import BroadcastFollower

        def on_update(update) -> None:
            metrics.WEIGHT_UPDATE_STALL_SECONDS.labels("broadcast").observe(update.stall_s)
            self._record_versions()

        self._follower = BroadcastFollower(self.engine, address, on_update=on_update)
        self._broadcast = self._background(self._follower.run())

    async def _stop_weights(self) -> None:
        if self._broadcast is not None:
            self._broadcast.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._broadcast
            self._broadcast = None
        if self._follower is not None:
            await self._follower.leave()
            self._follower = None

    def _record_versions(self) -> None:
        metrics.record_versions(
            engine_version=self.engine.version,
            newest_version=max(self.newest_version, self.engine.version),
        )
        self._version_changed.set()

    async def _wait_for_version(self, min_version: int) -> None:
        """Wait (measured) until the engine's weights may generate a task of min_version.
        The learner announced that version before releasing the task, so a broadcast
        normally brings it. When one did without a seat for us, only the learner's next
        round would, after data that may be ours: catch up from the announced snapshot
        once it is new enough. A wait past `version_wait_s` means the usual way is broken:
        catch up, or raise WeightsBehind (the task goes to another replica)."""
        started = time.monotonic()
        try:
            while self.engine.version < min_version:
                waited_s = time.monotonic() - started
                if waited_s > self.config.version_wait_s or self._missed(min_version):
                    await self._catch_up_from_snapshot(min_version)
                    continue
                self._version_changed.clear()
                # Polled as well: a broadcast round changes engine.version on its own.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._version_changed.wait(), timeout=0.5)
        finally:
            metrics.WAIT_SECONDS.labels("weights").inc(time.monotonic() - started)

    def _missed(self, min_version: int) -> bool:
        """A round of min_version or later went out without us, and a snapshot has it."""
        missed = self._follower.missed_version if self._follower else -1
        snapshot = self._announced.snapshot_version if self._announced else -1
        return min(missed, snapshot) >= min_version

    async def _catch_up_from_snapshot(self, min_version: int) -> None:
        snapshot = self._announced
        if (
            snapshot is None
            or not snapshot.snapshot_path
            or snapshot.snapshot_version < min_version
        ):
            raise WeightsBehind(f"at v{self.engine.version}, no snapshot of v{min_version} yet")
        async with self._catch_up_lock:  # one load for all the tasks that wait
            if self.engine.version >= min_version:
                return
            log.warning("weights at v%d, v%d needed: loading snapshot v%d",
                        self.engine.version, min_version, snapshot.snapshot_version)  # fmt: skip
            try:
                await self.engine.load_snapshot(snapshot.snapshot_path, snapshot.snapshot_version)
            except WeightUpdateError as e:
                raise WeightsBehind(f"snapshot v{snapshot.snapshot_version}: {e}") from e


async def _quietly(call, what: str, task: PromptTask) -> bool:
    """Send an ack/nak/term/heartbeat. Network boundary: if it is lost, JetStream redelivers
    the task after the ack wait, and trajectory ids make the replay harmless."""
    try:
        await call
        return True
    except (nats.errors.Error, TimeoutError) as e:
        log.warning("%s of task %s failed: %s", what, task.task_id, e)
        return False
