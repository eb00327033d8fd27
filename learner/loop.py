"""The learner's main loop on rank 0: the only place where bus, dispatcher, trainer and
weight broadcast meet.

    dispatcher ──prompts (step s released once v >= s - max_staleness)──► actors
        ▲                                                                  │
        │ v                                              trajectories      ▼
    ┌───┴───────────────────────── learner rank 0 ──────────────────────────────────┐
    │ intake (background task): fetch → decode → assemble groups → queue (held)     │
    │ step: take P groups (drop stale / future / errors, count, replace)             │
    │       → train (all ranks, in a thread) → v += 1 → weights → announce v (KV)   │
    │       → release the prompts v now admits                                       │
    │ every `checkpoint.interval` versions: DCP save, then ack what it covers        │
    │ every `eval_interval` versions: release the eval set pinned to v, record it    │
    │ end: last evals, drain released groups (dropped `unused`), checkpoint, done    │
    └────────────────────────────────────────────────────────────────────────────────┘

Durability: a training trajectory is acked only after a checkpoint that includes its effect
(trained, or counted as dropped). A crash loses nothing accepted: on start the learner
re-creates its consumer, so every unacked trajectory is redelivered at once, and the ids the
restored checkpoint covers (its last window: everything older was acked before it was
written) are acked again and skipped. Releases are written ahead (`dispatcher.json` next to
the checkpoints), so a resumed learner knows every prompt the lost run released and waits
for each group. Other ranks only follow commands (`learner/ranks.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

import nats.js.errors

from broker import client
from broker.config import BrokerConfig
from broker.wire import PolicyVersion
from learner import dispatcher as dispatch
from learner.batching import Group, samples_from_groups
from learner.checkpoint import STATE_FILE, TrainingState, checkpoint_dir
from learner.config import LearnerConfig
from learner.data import load_dataset
from learner.evals import Evals
from learner.intake import Intake
from learner.ledger import Ledger
from learner.ranks import RankCommands
from learner.reporting import Reporter
from learner.steps import decide_group, staleness_of

log = logging.getLogger(__name__)

DISPATCH_FILE = "dispatcher.json"


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
        self.dispatch_path = Path(config.checkpoint.dir) / DISPATCH_FILE
        self.window_ids: list[str] = []  # taken since the last checkpoint
        self.ledger = Ledger()
        self.checkpointed_version = -1
        self.started = time.monotonic()

    # ---- set-up ----------------------------------------------------------------------------

    async def _connect(self) -> None:
        self.nc = await client.connect(self.broker.url, name="learner")
        self.js = self.nc.jetstream()
        limits = self.broker.stream_limits()
        await client.ensure_streams(self.js, self.names, limits)
        # A fresh consumer delivers every unacked trajectory now, instead of after ack_wait
        # (the stream is a work queue: acked ones are gone).
        try:
            await self.js.delete_consumer(
                self.names.trajectories_stream, self.names.trajectories_consumer
            )
        except nats.js.errors.NotFoundError:
            pass
        await client.ensure_streams(self.js, self.names, limits)
        self.policy = client.PolicyStore(self.js, self.names)

    def _restore(self) -> set[str]:
        """Load the checkpoint (all ranks); returns the trajectory ids it covers."""
        covered: set[str] = set()
        if self.resume_from is not None:
            state = self.commands.load(self.resume_from)
            self.ledger = Ledger.from_cursor(state.dataset_cursor)
            self.checkpointed_version = state.version
            covered = set(state.trained_ids)
            log.info("resumed from %s at version %d", self.resume_from, state.version)
        if self.config.checkpoint.resume and self.dispatch_path.is_file():
            released = json.loads(self.dispatch_path.read_text())["num_released"]
            self.ledger.num_released = max(self.ledger.num_released, released)
        return covered

    def _cursor(self) -> dict:
        return {**self.ledger.to_cursor(), **self.reporter.position()}

    # ---- the loop ----------------------------------------------------------------------------

    async def run(self) -> dict:
        cfg = self.config
        covered = self._restore()
        await self._connect()
        self.stream = dispatch.PromptStream(
            load_dataset(cfg.train_data),
            run_id=self.names.namespace,
            group_size=cfg.group_size,
            prompts_per_step=cfg.prompts_per_step,
            max_staleness=cfg.max_staleness,
            seed=cfg.seed,
        )
        self.evals = Evals(
            load_dataset(cfg.eval_data) if cfg.eval_data else [],
            interval=cfg.eval_interval,
            samples_per_prompt=cfg.eval_samples_per_prompt,
            run_id=self.names.namespace,
            results=self.ledger.eval_results,
            record=lambda version, groups, task_keys: self.reporter.record_eval(
                version, groups, wall_s=time.monotonic() - self.started, task_keys=task_keys
            ),
        )
        self.version = self.commands.version
        await self._announce()
        self.intake = Intake(
            client.TrajectoryConsumer(self.js, self.names),
            covered_ids=covered,
            on_eval_group=self.evals.on_group,
        )
        self.intake_task = asyncio.create_task(self.intake.run())
        try:
            while self.version < cfg.total_steps:
                await self._maybe_eval()
                await self._release()
                step = self.version
                groups, waited_s = await self._take_groups(cfg.prompts_per_step)
                await self._train(step, groups, waited_s)
                if self.version % cfg.checkpoint.interval == 0 and self.version < cfg.total_steps:
                    await self._checkpoint()
                await self._ack_uploaded()
            await self._maybe_eval(final=True)
            await self.evals.wait(self.config.eval_timeout_s)
            await self._drain()
            await self._checkpoint()
            await self._ack_uploaded(wait=True)
            return await self._done()
        finally:
            self.intake_task.cancel()
            await asyncio.gather(self.intake_task, return_exceptions=True)
            await self.nc.close()

    async def _release(self) -> None:
        cfg = self.config
        count = dispatch.num_releasable(
            version=self.version,
            num_released=self.ledger.num_released,
            num_dropped_groups=self.ledger.num_dropped_groups,
            prompts_per_step=cfg.prompts_per_step,
            max_staleness=cfg.max_staleness,
            total_steps=cfg.total_steps,
        )
        if count == 0:
            return
        first = self.ledger.num_released
        self.ledger.num_released += count
        _write_atomically(
            self.dispatch_path, json.dumps({"num_released": self.ledger.num_released})
        )
        if self.artifacts is not None:  # a fresh machine resuming from the bucket needs it
            await asyncio.to_thread(self.artifacts.dispatcher_written, self.dispatch_path)
        tasks = [self.stream.task(i, version=self.version) for i in range(first, first + count)]
        await client.publish_prompts(self.js, self.names, tasks)

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
        self.window_ids.extend(group.trajectory_ids)
        if reason is not None:
            self._count_drop(group.group_id, reason, group.trajectory_ids)

    def _count_drop(self, group_id: str, reason: str, ids: list[str]) -> None:
        if ids:
            self.ledger.drop(reason, len(ids))
            self.reporter.record_drop(
                version=self.version, group_id=group_id, reason=reason, trajectory_ids=ids
            )

    async def _take_groups(self, num_groups: int) -> tuple[list[Group], float]:
        """The next `num_groups` trainable groups, dropping (and counting) the others."""
        started = time.monotonic()
        taken: list[Group] = []
        while len(taken) < num_groups:
            group = await self._next_group()
            decision = decide_group(
                group, version=self.version, max_staleness=self.config.max_staleness
            )
            self._take(group, decision.drop_reason)
            if decision.drop_reason is not None:
                log.info("dropped group %s: %s", group.group_id, decision.drop_reason)
                await self._release()  # its replacement
                continue
            self._count_drop(group.group_id, "errors", list(decision.error_ids))
            taken.append(decision.group)
        return taken, time.monotonic() - started

    async def _train(self, step: int, groups: list[Group], waited_s: float) -> None:
        cfg = self.config
        samples = samples_from_groups(
            groups,
            estimator=cfg.algorithm.advantage_estimator,
            normalize_std=cfg.algorithm.normalize_std,
            eps=cfg.algorithm.std_eps,
            step_wise=cfg.step_wise,
        )
        staleness = [staleness_of(g, step) for g in groups]
        started = time.monotonic()
        metrics = await asyncio.to_thread(self.commands.train, samples)
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
                self._count_drop(g.group_id, "nonfinite", g.trajectory_ids)
            self.reporter.record_skip(
                {"kind": "skipped", "step": step, "version": self.version, **metrics}
            )
            return
        self.ledger.train(len(samples), staleness)
        self.version = self.commands.version
        started = time.monotonic()
        weights = await asyncio.to_thread(self.commands.publish_weights, self.version)
        broadcast_s = time.monotonic() - started
        await self._announce()
        num_tokens = sum(s.num_tokens for s in samples)
        record = {
            "kind": "train",
            "step": step,
            "version": self.version,
            "wall_s": time.monotonic() - self.started,
            "reward_mean": sum(sum(g.rewards) for g in groups) / len(samples),
            "staleness": staleness,
            "staleness_max_batch": max(staleness),
            "max_staleness_seen": self.ledger.max_staleness_seen,
            "tokens_per_s": num_tokens / max(train_s, 1e-9),
            "num_tokens": num_tokens,
            "wait_data_s": waited_s,
            "train_s": train_s,
            "broadcast_s": broadcast_s,
            "broadcast_receivers": weights.get("num_receivers", 0),
            "broadcast_bytes": weights.get("num_bytes", 0),  # with LoRA: the adapter's
            "released": self.ledger.num_released,
            "trained": self.ledger.num_trained,
            "dropped": self.ledger.num_dropped,
            "dropped_by_reason": dict(self.ledger.dropped),
            "held_unacked": self.intake.num_held,
            **{f"train/{k}": v for k, v in metrics.items()},
        }
        self.reporter.record_train(record, step=step, groups=groups)

    async def _announce(self) -> None:
        snapshot = self.commands.snapshot
        await self.policy.publish(
            PolicyVersion(
                version=self.version,
                published_at=time.time(),
                snapshot_path=str(snapshot[0]) if snapshot else "",
                snapshot_version=snapshot[1] if snapshot else -1,
                broadcast_addr=self.commands.broadcast_addr,
            )
        )

    async def _checkpoint(self) -> None:
        if self.version == self.checkpointed_version and not self.window_ids:
            return  # nothing new since the last one
        path = checkpoint_dir(self.config.checkpoint.dir, self.commands.step)
        if (path / STATE_FILE).is_file():
            # Never overwrite a complete checkpoint in place (a crash mid-save would leave
            # neither); what it misses stays unacked and is redelivered to the next run.
            log.warning("checkpoint %s exists; not saving over it", path)
            return
        # With a bucket, ids of checkpoints not yet verified there are still unacked: this
        # checkpoint covers them too (a resume from it must skip them when redelivered).
        unacked = self.artifacts.unacked_ids if self.artifacts is not None else []
        state = TrainingState(dataset_cursor=self._cursor(), trained_ids=unacked + self.window_ids)
        await asyncio.to_thread(self.commands.save, state)
        self.checkpointed_version = self.version
        if self.artifacts is not None:
            # Acked only once the checkpoint is in the bucket: a fresh machine resumes from
            # the bucket, and needs every trajectory its checkpoint does not cover.
            self.artifacts.hold_acks(self.commands.step, self.window_ids)
            self.window_ids = []
            return
        # The checkpoint covers these now. A failed ack keeps its id in the next window,
        # so the next checkpoint covers it again.
        self.window_ids = await self.intake.ack(self.window_ids)

    async def _ack_uploaded(self, *, wait: bool = False) -> None:
        """Ack what checkpoints verified in the bucket cover (`wait`: for the queued
        uploads first, bounded by `storage.drain_timeout_s`)."""
        if self.artifacts is None:
            return
        if wait:
            await asyncio.to_thread(self.artifacts.wait_idle)
        failed = await self.intake.ack(self.artifacts.take_durable_acks())
        self.window_ids = failed + self.window_ids  # covered by the next checkpoint again

    # ---- end of run --------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Wait (bounded) for every released group; count each as dropped `unused`."""
        deadline = time.monotonic() + self.config.drain_timeout_s
        while self.ledger.num_outstanding_groups > 0:
            group = await self._next_group(timeout_s=max(0.0, deadline - time.monotonic()))
            if group is None:
                log.warning(
                    "%d released groups did not arrive within %.0fs",
                    self.ledger.num_outstanding_groups,
                    self.config.drain_timeout_s,
                )
                return
            self._take(group, "unused")

    async def _done(self) -> dict:
        info = await self.js.stream_info(self.names.trajectories_stream)
        summary = {
            "kind": "done",
            "wall_s": time.monotonic() - self.started,
            "version": self.version,
            "released_groups": self.ledger.num_released,
            "taken_groups": self.ledger.num_taken_groups,
            "outstanding_groups": self.ledger.num_outstanding_groups,
            "trained": self.ledger.num_trained,
            "dropped": self.ledger.num_dropped,
            "dropped_by_reason": dict(self.ledger.dropped),
            "max_staleness_seen": self.ledger.max_staleness_seen,
            "invalid": self.intake.num_invalid,
            "redelivered": self.intake.num_redelivered,
            "stream_messages_stored": info.state.last_seq,
            "eval_pass_at_1": {str(v): r["pass_at_1"] for v, r in self.ledger.eval_results.items()},
        }
        self.reporter.record_done(summary)
        return summary

    async def _maybe_eval(self, *, final: bool = False) -> None:
        tasks = self.evals.due(self.version, final=final)
        if tasks:
            await client.publish_prompts(self.js, self.names, tasks)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
