"""The learner's main loop on rank 0: the only place where bus, dispatcher, trainer and
weight broadcast meet.

    dispatcher ──prompts (step s released once v >= s - bound)──────────► actors
        ▲                                                                  │
        │ v                                              trajectories      ▼
    ┌───┴───────────────────────── learner rank 0 ──────────────────────────────────┐
    │ intake (background task): fetch → decode → assemble groups → queue (held)     │
    │ step: take P groups (drop stale / future / errors, count, replace)            │
    │       → train (all ranks, in a thread) → v += 1 → weights → announce v (KV)   │
    │       → the next step's bound (learner/bound.py) → release what v now admits  │
    │ every `checkpoint.interval` versions: DCP save beside the next wait for data   │
    │   (learner/checkpoints.py), joined before the next train; then ack its ids     │
    │ every `eval_interval` versions: release the eval set pinned to v, record it    │
    │ end: last evals, drain released groups (dropped `unused`), checkpoint, done    │
    └────────────────────────────────────────────────────────────────────────────────┘

Durability: a trajectory is acked only after a checkpoint that includes its effect
(trained, dropped or eval). On start the consumer is re-created (every unacked trajectory
comes at once) and the ids the checkpoint covers are acked and skipped; releases are
written ahead (learner/releases.py). Each learner process announces its own lineage, and
waiting for data it snapshots the current version for engines that missed its broadcast
(learner/announce.py); bus calls that must not be lost wait out a broker restart
(`broker.retry`). Other ranks follow commands (learner/trainer/ranks.py;
docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path

from broker import client
from broker.config import BrokerConfig
from broker.retry import until_done
from common.tasks import cancel_and_wait
from learner.announce import PolicyAnnouncer
from learner.batching import Group, samples_from_groups
from learner.bound import StalenessBound
from learner.bus_metrics import poll as poll_queue_depths
from learner.checkpoints import Checkpoints
from learner.config import LearnerConfig
from learner.data import load_dataset
from learner.evals import Evals
from learner.intake import Intake
from learner.ledger import FILTERED, Ledger
from learner.releases import open_releases
from learner.reporting import Reporter, done_record, staleness_fields, train_record
from learner.steps import decide_group, empty_step_warning, staleness_of
from learner.trainer.ranks import RankCommands

log = logging.getLogger(__name__)

ENGINES_CHECK_S = 1.0  # waiting for data, how often to ask whether an engine missed v


class Learner:
    def __init__(
        self,
        config: LearnerConfig,
        broker: BrokerConfig,
        commands: RankCommands,
        reporter: Reporter,
        *,
        resume_from: Path | None = None,
        artifacts=None,
    ) -> None:
        if config.train_data is None:
            raise ValueError("learner.train_data is required to run the learner")
        self.config = config
        self.broker = broker
        self.names = broker.names
        self.commands = commands
        self.reporter = reporter
        self.resume_from = resume_from
        self.artifacts = artifacts  # learner.artifacts.ArtifactSync when a bucket is set
        self.checkpoints = Checkpoints(commands, root=config.checkpoint.dir, artifacts=artifacts)
        self.ledger = Ledger()
        self.malformed_before = 0  # counted by earlier learner processes (the checkpoint)
        self.resumed_cursor: dict | None = None  # the checkpoint's, when one is resumed
        self.lineage = uuid.uuid4().hex[:12]
        self.started = time.monotonic()

    async def _connect(self) -> None:
        self.nc = await client.connect_to(self.broker, name="learner")
        self.js = self.nc.jetstream()
        limits = self.broker.stream_limits()

        await until_done(
            lambda: client.ensure_streams_fresh_consumer(self.js, self.names, limits),
            "stream setup",
        )
        self.announcer = PolicyAnnouncer(
            client.PolicyStore(self.js, self.names),
            self.commands,
            initial_weights=self.config.model_path,
            lineage=self.lineage,
            stall_snapshot_s=self.config.stall_snapshot_s,
        )

    def _restore(self) -> set[str]:
        """Load the checkpoint (all ranks); returns the trajectory ids it covers."""
        covered: set[str] = set()
        if self.resume_from is not None:
            state = self.commands.load(self.resume_from)
            self.ledger = Ledger.from_cursor(state.dataset_cursor)
            self.resumed_cursor = state.dataset_cursor
            self.malformed_before = self.ledger.num_malformed
            self.checkpoints.checkpointed_version = state.version
            covered = set(state.trained_ids)
            log.info("resumed from %s at version %d", self.resume_from, state.version)
        return covered

    def _cursor(self) -> dict:
        self.ledger.num_malformed = self.malformed_before + self.intake.num_malformed
        stream = {"difficulty": state} if (state := self.releases.stream.state()) else {}
        if (bound := self.bound.state()) is not None:
            stream["staleness_bound"] = bound
        return {**self.ledger.to_cursor(), **self.reporter.position(), "run_id": self.run_id,
                **stream}  # fmt: skip

    async def run(self) -> dict:
        cfg = self.config
        covered = self._restore()
        await self._connect()
        self.releases = await open_releases(cfg, self.ledger, js=self.js, names=self.names,
            checkpoint_cursor=self.resumed_cursor, artifacts=self.artifacts)  # fmt: skip
        self.run_id = self.releases.run_id  # in every task id (learner/dispatcher.py)
        self.evals = Evals(
            load_dataset(cfg.eval_data) if cfg.eval_data else [],
            interval=cfg.eval_interval,
            samples_per_prompt=cfg.eval_samples_per_prompt,
            run_id=self.run_id,
            results=self.ledger.eval_results,
            record=lambda version, groups, task_keys: self.reporter.record_eval(
                version, groups, wall_s=time.monotonic() - self.started, task_keys=task_keys
            ),
        )
        self.version = self.commands.version
        self.bound = StalenessBound(cfg, (self.resumed_cursor or {}).get("staleness_bound"))
        self.releases.stream.max_staleness = self.bound.current
        self.group_rules = dict(
            max_staleness=self.bound.current,  # for a group that does not say its own
            vocab_size=self.commands.vocab_size,
            staleness_rule=cfg.staleness_rule,
            min_fresh_fraction=cfg.min_fresh_fraction,
        )
        self.stale_tokens_masked = 0  # this step's, under the `token` staleness rule
        await asyncio.to_thread(self.commands.start_weights_log)
        await self.announcer.announce(self.version)
        self.intake = Intake(
            client.TrajectoryConsumer(self.js, self.names),
            covered_ids=covered,
            on_eval_group=self.evals.on_group,
            run_id=self.run_id,
        )
        self.intake_task = asyncio.create_task(self.intake.run())
        self.depths_task = asyncio.create_task(poll_queue_depths(self.js, self.names))
        try:
            while self.version < cfg.total_steps:
                await self._maybe_eval()
                await self.releases.release(self.version)
                step = self.version
                groups, waited_s, filtered = await self._take_groups(cfg.prompts_per_step)
                await self._train(step, groups, waited_s, filtered)
                if self.version % cfg.checkpoint.interval == 0 and self.version < cfg.total_steps:
                    await self._checkpoint()
                await self.checkpoints.ack_uploaded(self.intake)
            await self._maybe_eval(final=True)
            await self.evals.wait(self.config.eval_timeout_s)
            await self._drain()
            await self._checkpoint()
            await self.checkpoints.saved()
            await self.checkpoints.ack_uploaded(self.intake, wait=True)
            return await self._done()
        finally:
            saving = [self.checkpoints.saving] if self.checkpoints.saving else []
            await cancel_and_wait([self.intake_task, self.depths_task, *saving])
            await self.nc.close()

    async def _next_group(self, timeout_s: float | None = None) -> Group | None:
        """The next complete training group (None after `timeout_s`); re-raises if the
        intake task died, rather than waiting forever on a queue nobody fills."""
        get = asyncio.ensure_future(self.intake.groups.get())
        done, _ = await asyncio.wait(
            {get, self.intake_task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if get in done:
            return get.result()
        get.cancel()
        if self.intake_task in done:
            self.intake_task.result()
            raise RuntimeError("the trajectory intake stopped")
        return None

    def _take(self, group: Group, reason: str | None) -> None:
        """Bookkeeping of one group leaving the queue (trained, or dropped with `reason`)."""
        self.ledger.take_group(dropped_reason=reason)
        self.ledger.count_resumed(group.trajectories)
        self.checkpoints.window_ids.extend(group.trajectory_ids)
        outcome = group.rewards if reason in (None, FILTERED) else None  # None: went wrong
        self.releases.stream.taken(group.group_id, outcome)  # learner.difficulty counts it
        if reason is not None:
            self._count_drop(group.group_id, reason, group.trajectory_ids, whole_group=True)

    def _count_drop(self, group_id: str, reason: str, ids: list[str], *, whole_group: bool):
        if ids:
            self.ledger.drop(reason, len(ids))
            self.reporter.record_drop(version=self.version, group_id=group_id, reason=reason,
                                      whole_group=whole_group, trajectory_ids=ids)  # fmt: skip

    async def _take_groups(self, num_groups: int) -> tuple[list[Group], float, int]:
        """The next `num_groups` trainable groups, dropping (and counting) the others;
        also the seconds waited and the groups filtered for no signal."""
        started = idle_since = time.monotonic()
        taken: list[Group] = []
        self.stale_tokens_masked = 0
        filtered, cap = 0, self.config.max_filtered_per_step if self.config.dynamic_sampling else 0
        while len(taken) < num_groups:
            group = await self._next_group(timeout_s=ENGINES_CHECK_S)
            if group is None:
                idle_s = time.monotonic() - idle_since
                await self.announcer.waiting_for_data(self.version, idle_s=idle_s)
                continue
            idle_since = time.monotonic()
            decision = decide_group(group, version=self.version, filter_no_signal=filtered < cap,
                                    **self.group_rules)  # fmt: skip
            self._take(group, decision.drop_reason)
            if decision.drop_reason is not None:
                log.info("dropped group %s: %s", group.group_id, decision.drop_reason)
                await self.releases.release(self.version)  # its replacement
                filtered += decision.drop_reason == FILTERED
                if filtered == cap and decision.drop_reason == FILTERED:
                    log.warning("step %d: %d groups without reward signal filtered, the most "
                                "learner.max_filtered_per_step allows: it takes the rest as they "
                                "come", self.version, cap)  # fmt: skip
                continue
            for reason, ids in decision.removed.items():
                self._count_drop(group.group_id, reason, list(ids), whole_group=False)
            self.stale_tokens_masked += decision.masked_stale_tokens
            taken.append(decision.group)
        return taken, time.monotonic() - started, filtered

    async def _train(self, step: int, groups: list[Group], waited_s: float, filtered: int):
        cfg = self.config
        samples = samples_from_groups(groups, algorithm=cfg.algorithm, step_wise=cfg.step_wise)
        staleness = [staleness_of(g, step) for g in groups]
        checkpoint_wait_s = await self.checkpoints.saved()  # it reads what training changes
        started = time.monotonic()
        bound = self.bound.current
        metrics = await asyncio.to_thread(self.commands.train, samples, self.bound.algorithm())
        train_s = time.monotonic() - started
        if metrics["skipped"]:
            # A non-finite loss or gradient: no update, so these taught nothing. They are
            # dropped (and replaced); the step is taken again at the same version.
            log.warning(
                "step %d skipped: loss %s, grad norm %s",
                step,
                metrics["loss"],
                metrics["grad_norm"],
            )
            for g in groups:
                self.ledger.num_dropped_groups += 1  # replaced, as a dropped group is
                self._count_drop(g.group_id, "nonfinite", g.trajectory_ids, whole_group=True)
            self.reporter.record_skip(
                {"kind": "skipped", "step": step, "version": self.version, **metrics}
            )
            return
        episodes = sum(len(g.trajectories) for g in groups)  # one may be 2+ samples (agents)
        if not self.ledger.train(episodes, staleness, int(metrics["num_loss_tokens"])):
            log.warning(empty_step_warning(step, groups))
        self.version = self.commands.version
        self._next_bound(waited_s, train_s, metrics, groups)
        started = time.monotonic()
        # Evals run pinned to their version: a replica that missed the broadcast (restarted
        # meanwhile) must be able to load exactly that version from disk.
        eval_due = self.evals.runs_at(self.version, last_version=cfg.total_steps)
        weights = await asyncio.to_thread(self.commands.publish_weights, self.version, eval_due)
        broadcast_s = time.monotonic() - started
        await self.announcer.announce(self.version)
        record = train_record(
            step=step,
            version=self.version,
            groups=groups,
            samples=samples,
            staleness=staleness,
            metrics=metrics,
            seconds={
                "wall_s": time.monotonic() - self.started,
                "wait_data_s": waited_s,
                "train_s": train_s,
                "broadcast_s": broadcast_s,  # with a snapshot's write when one is due
                "broadcast_transfer_s": weights.get("transfer_s", 0.0),  # the wire alone
                "checkpoint_wait_s": checkpoint_wait_s,  # what the data wait did not hide
            },
            ledger=self.ledger,
            num_receivers=weights.get("num_receivers", 0),
            num_bytes=weights.get("num_bytes", 0),
            held_unacked=self.intake.num_held,
        )
        record["time"] = time.time()  # the wall clock of the run's events.jsonl and logs
        record["max_staleness"] = bound  # in force for this step's releases and consumption
        record["filtered_groups"] = filtered  # learner.dynamic_sampling: no reward signal
        record.update(staleness_fields(groups, self.stale_tokens_masked, metrics))
        record.update(broadcast_raw_bytes=weights.get("raw_bytes", 0),  # weight_sync.delta
                      broadcast_keyframe=weights.get("keyframe", True),
                      weights_log_bytes=weights.get("log_bytes", 0))  # snapshot_deltas  # fmt: skip
        record.update(self.releases.stream.report())  # learner.difficulty: prompts passed over
        self.reporter.record_train(record, step=step, groups=groups)

    def _next_bound(self, waited_s: float, train_s: float, metrics: dict, groups: list) -> None:
        """Move the bound after a step (fixed: it stays); the next releases carry it."""
        bound = self.bound.after_step(waited_s, train_s, metrics, groups)
        self.releases.stream.max_staleness = self.group_rules["max_staleness"] = bound

    async def _checkpoint(self) -> None:
        await self.checkpoints.save(version=self.version, intake=self.intake,
                                    cursor=self._cursor, ledger=self.ledger)  # fmt: skip

    async def _drain(self) -> None:
        """Wait (bounded) for every released group; count each as dropped `unused`."""
        deadline = time.monotonic() + self.config.drain_timeout_s
        while self.ledger.num_outstanding_groups > 0:
            group = await self._next_group(timeout_s=max(0.0, deadline - time.monotonic()))
            if group is None:
                left, timeout_s = self.ledger.num_outstanding_groups, self.config.drain_timeout_s
                log.warning("%d released groups did not arrive within %.0fs", left, timeout_s)
                return
            self._take(group, "unused")

    async def _done(self) -> dict:
        info = await until_done(
            lambda: self.js.stream_info(self.names.trajectories.stream), "stream info"
        )
        malformed = self.malformed_before + self.intake.num_malformed
        await self.releases.finish_run()
        summary = done_record(run_id=self.run_id, lineage=self.lineage,
                              wall_s=time.monotonic() - self.started, version=self.version,
                              ledger=self.ledger, intake=self.intake, malformed=malformed,
                              stream_state=info.state)  # fmt: skip
        self.reporter.record_done(summary)
        return summary

    async def _maybe_eval(self, *, final: bool = False) -> None:
        tasks = self.evals.due(self.version, final=final)
        if tasks:
            await client.publish_prompts(self.js, self.names, tasks)
