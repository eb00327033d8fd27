"""One actor replica: pulls prompt tasks, plays each as a GRPO group on its engine against
the env servers, publishes every trajectory, and keeps its weights current.

Delivery rules (the bus is at-least-once; trajectory ids make it exactly-once in effect):
- A task is heart-beaten (`in_progress`) while its group runs, acked only after every
  trajectory of the group is stored by the stream, terminated when it can never succeed
  (malformed, prompt longer than max_input_length), and nak'd with a delay when this
  replica fails (so another one takes it). A replica that dies just stops heart-beating;
  the task comes back after the broker's ack wait.
- A replica told to stop (SIGTERM: a scale-in, a preemption notice) leaves without losing
  a token: it takes no more tasks, each episode stops at its next turn boundary with its
  checkpoint recorded, and each group goes back to the broker at once, for another replica
  to continue every episode from that turn. Only a turn still running when
  `drain_timeout_s` ends is cut (and generated again from the turn before); without
  episode checkpoints the groups play to their end instead, within the same grace.
- Trajectory ids are `<task_id>/<sample_index>` and go out as `Nats-Msg-Id`: a group
  re-played by another replica stores only the samples the first one had not published.
- Weights (`actors.policy_weights.PolicyWeights`): a new replica loads the newest snapshot
  the learner announced, then joins every broadcast round, or loads a snapshot of one it
  missed, and rolls back to a restarted learner's snapshot. A task runs once the engine's
  version is at least its `min_version`; one that cannot get it in time is handed back.

Engine and env connector are parameters: tests run the loop on fakes (tests/fakes.py),
`actors.replica.replica_main` builds the real ones."""

from __future__ import annotations

import asyncio
import logging
import time

import nats.errors

from actors import metrics
from actors.agent_endpoint import AgentEndpoint, family_tool_calls
from actors.chat import ChatTemplate
from actors.config import ActorConfig
from actors.episode import Rollout, validate_task
from actors.episode_checkpoints import GroupCheckpoints
from actors.group import Leaving, run_group
from actors.in_flight import EngineDemand, tasks_to_take
from actors.policy_weights import PolicyWeights, WeightsBehind
from actors.snapshots import SnapshotSource
from actors.trajectory import to_trajectory
from actors.types import ActorEngine, EnvConnector, EpisodeResult
from broker import client as bus
from broker.config import BrokerConfig
from broker.wire import PromptTask
from protos.client import TaskRejected
from protos.types import DEFAULT_TOOL_FORMAT

log = logging.getLogger(__name__)


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
        self._demand = EngineDemand()  # how much of the engine our groups want now
        self.engine, self.chat = engine, chat
        self.env = self._demand.counting(env)  # its calls in flight count as engine room
        self._generating = metrics.EngineBusyClock(engine)  # what episodes generate with
        self.agents = AgentEndpoint(  # for agent workflows; listens from the first one on
            self._demand.for_agents(self._generating),
            chat,
            config.rollout,
            model_name=config.agent_endpoint.model_name,
            parse_tool_calls=family_tool_calls(config.env.tool_format or DEFAULT_TOOL_FORMAT),
            address=config.agent_endpoint,
        )
        self.actor_id = actor_id
        self.weights = PolicyWeights(
            engine=engine,
            snapshots=snapshots or SnapshotSource(),  # local paths, or s3:// downloads
            version_wait_s=config.version_wait_s,
            background=self._background,
            weight_source=config.weight_source,
        )
        self.num_published = 0
        self.episodes: bus.EpisodeStore | None = None
        self._failure: BaseException | None = None
        self._stop = asyncio.Event()
        self._pull_expires_at = 0.0
        self._handed_back = 0
        """Groups handed back at turn boundaries as this replica left."""
        """When the server forgets our newest pull request: a task nak'd before then would be
        redelivered to that request, i.e. to us as we leave, and sit out the ack wait."""

    @property
    def ready(self) -> bool:
        """What /readyz reports (from the metrics server's thread): the engine runs, its
        start-up weights are settled, and it holds the newest announced version or follows
        the learner's broadcast. False while stopping."""
        return not self._stop.is_set() and self.weights.current

    async def run(self, stop: asyncio.Event) -> None:
        """
        PolicyStore.follow ─► snapshot load / broadcast rounds ─► engine.version ──────┐
                                                                                      │
        prompt work queue ──fetch(engine room)──► one task per group (in_flight.py):   │
                                                   wait engine.version ≥ min_version ◄┘
                                                   in_progress every heartbeat_s
                                                   run_group: n episodes ⇄ engine, env servers
                                                     each finished episode ─► publish (Msg-Id)
                                                   ack | term (rejected) | nak(delay)
        """
        nc = await bus.connect_to(self.broker, name=f"actor {self.actor_id}")
        try:
            js = nc.jetstream()
            names = self.broker.names
            await bus.ensure_streams(js, names, self.broker.stream_limits())
            self.puller = bus.PromptPuller(js, names)
            self.publisher = bus.TrajectoryPublisher(js, names)
            self.episodes = bus.EpisodeStore(js, names) if self.config.episode_checkpoints else None
            self._stop = stop
            await self.weights.start(bus.PolicyStore(js, names))
            follower = self._background(self.weights.follow())
            try:
                await self._serve(stop)
            finally:
                await self.agents.stop()
                follower.cancel()
                await self.weights.stop()
                self.weights.weights_log.close()
        finally:
            await nc.close()
        if self._failure is not None:
            raise self._failure

    # ---- prompt tasks ------------------------------------------------------------------------

    async def _serve(self, stop: asyncio.Event) -> None:
        running: set[asyncio.Task] = set()
        stopping = asyncio.create_task(stop.wait())
        while not stop.is_set():
            self._demand.changed.clear()
            free = tasks_to_take(
                engine_slots=self.config.engine.max_num_seqs,
                wanting_engine=self._demand.wanting_engine,
                groups=len(running),
                group_size=self._demand.largest_group,
                max_groups=self.config.max_groups_in_flight,
            )
            if free <= 0:
                # Room opens when an episode ends or goes to an env server, or a group ends.
                room = asyncio.create_task(self._demand.changed.wait())
                await asyncio.wait({room, stopping, *running}, return_when=asyncio.FIRST_COMPLETED)
                room.cancel()
                continue
            started = time.monotonic()
            self._pull_expires_at = started + self.config.fetch_timeout_s + 0.1
            try:
                received = await self.puller.fetch(free, timeout_s=self.config.fetch_timeout_s)
            # Network boundary: the connection is re-establishing; pull again shortly.
            except nats.errors.Error as e:
                log.warning("pulling prompt tasks failed: %s", e)
                await asyncio.sleep(self.config.fetch_timeout_s)
                received = []
            metrics.WAIT_SECONDS.labels("prompts").inc(time.monotonic() - started)
            for item in received:
                held = self._demand.take_group(item.task.group_size)
                task = asyncio.create_task(self._run_task(item, stop, held))
                running.add(task)
                task.add_done_callback(running.discard)
        stopping.cancel()
        if running:  # leave: groups stop at their turn boundaries (or finish), the rest go back
            _, unfinished = await asyncio.wait(running, timeout=self.config.drain_timeout_s)
            log.info(
                "leaving: %d groups handed back at their episodes' turn boundaries, %d cut "
                "at the end of the %.0f s grace (drain_timeout_s)",
                self._handed_back, len(unfinished), self.config.drain_timeout_s,
            )  # fmt: skip
            await self._pull_expired()
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)

    async def _run_task(self, received: bus.ReceivedPrompt, stop: asyncio.Event, held: int):
        """Run one task, whose `held` episodes `self._demand` counts until they end."""
        task = received.task
        metrics.GROUPS_IN_FLIGHT.inc()
        unfinished = 0
        heartbeat = asyncio.create_task(self._heartbeat(received))
        checkpoints = GroupCheckpoints(self.episodes, task, self.actor_id)

        async def on_turn(index: int, episode) -> None:
            await checkpoints.on_turn(index, episode)
            if stop.is_set() and checkpoints.store is not None:
                raise Leaving  # at this turn boundary, recorded: another replica goes on

        async def publish(index: int, result: EpisodeResult) -> None:
            nonlocal unfinished, held
            unfinished -= 1
            held -= 1
            self._demand.end_episodes(1)
            metrics.EPISODES_IN_FLIGHT.dec()
            metrics.record_episode(task.env_class, result)
            trajectory = to_trajectory(
                result, task=task, sample_index=index, actor_id=self.actor_id
            )
            await self.publisher.publish(trajectory)
            self.num_published += 1
            metrics.TRAJECTORIES_PUBLISHED.inc()
            await checkpoints.stored(index, result)

        try:
            validate_task(task)
            await self.weights.wait_for_version(task.min_version)
            saved = await checkpoints.recall(redelivered=received.num_delivered > 1)
            skipped = sum(c.stored for c in saved.values())  # published by a replica that died
            held -= skipped
            self._demand.end_episodes(skipped)
            unfinished = task.group_size - skipped
            metrics.EPISODES_IN_FLIGHT.inc(unfinished)
            rollout = self._rollout(task)
            await run_group(rollout, task, on_result=publish, saved=saved, on_turn=on_turn)
        except TaskRejected as e:
            metrics.TASKS.labels("rejected").inc()
            await _quietly(received.reject(str(e)), "terminate", task)
            await checkpoints.forget()
        except Leaving as e:
            await self._hand_back(received, checkpoints, e)
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
            await checkpoints.settle()  # before the task goes to another replica
            await _quietly(received.nak(self.config.nak_delay_s), "nak", task)
            log.exception("task %s failed; stopping this replica", task.task_id)
            self._failure = self._failure or e
            stop.set()
        else:
            if await _quietly(received.ack(), "ack", task):
                metrics.TASKS.labels("acked").inc()
                await checkpoints.forget()
        finally:
            heartbeat.cancel()
            self._demand.end_episodes(held)
            metrics.GROUPS_IN_FLIGHT.dec()
            metrics.EPISODES_IN_FLIGHT.dec(max(unfinished, 0))

    def _rollout(self, task: PromptTask) -> Rollout:
        return Rollout(
            engine=self._generating,
            env=self.env,
            chat=self.chat,
            limits=self.config.rollout,
            sampling=self.config.eval_sampling if task.is_eval else self.config.sampling,
            env_config=self.config.env,
            agents=self.agents,
        )

    async def _hand_back(
        self, received: bus.ReceivedPrompt, checkpoints: GroupCheckpoints, left: Leaving
    ) -> None:
        """The replica is leaving and the group's episodes stopped at turn boundaries: their
        checkpoints recorded, the task goes back at once for another replica to continue."""
        metrics.TASKS.labels("handed_back").inc()
        self._handed_back += 1
        log.info("leaving: %s; handing the task back", left)
        await checkpoints.settle()
        await self._pull_expired()
        await _quietly(received.nak(0), "nak", received.task)

    async def _pull_expired(self) -> None:
        await asyncio.sleep(max(self._pull_expires_at - time.monotonic(), 0.0))

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


async def _quietly(call, what: str, task: PromptTask) -> bool:
    """Send an ack/nak/term/heartbeat. Network boundary: if it is lost, JetStream redelivers
    the task after the ack wait, and trajectory ids make the replay harmless."""
    try:
        await call
        return True
    except (nats.errors.Error, TimeoutError) as e:
        log.warning("%s of task %s failed: %s", what, task.task_id, e)
        return False
