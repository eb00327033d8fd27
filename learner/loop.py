"""The learner's main loop on rank 0: the only place where bus, dispatcher, trainer and
weight broadcast meet.

    dispatcher ──prompts (step s released once v >= s - max_staleness)──► actors
        ▲                                                                  │
        │ v                                              trajectories      ▼
    ┌───┴───────────────────────── learner rank 0 ──────────────────────────────────┐
    │ consume (background task): fetch → decode → assemble groups → eval | train queue│
    │ step: take P groups (drop stale, count) → train (all ranks, in a thread)        │
    │       → v += 1 → broadcast weights → announce v (KV) → release more prompts     │
    │ every `checkpoint.interval`: DCP save, then ack what it covers                  │
    │ every `eval_interval` versions: release the eval set pinned to v, record pass@1 │
    └────────────────────────────────────────────────────────────────────────────────┘

Acknowledgement is the learner's durability: a trajectory is acked only after a checkpoint
that includes its effect (trained, or counted as dropped). A crash loses nothing accepted:
on resume the consumer is re-created, every unacked trajectory is redelivered at once, and
the ids the checkpoint already covers are skipped. Other ranks only follow commands
(`learner/ranks.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from pathlib import Path

import nats.js.errors

from broker import client
from broker.config import BrokerConfig
from broker.trajectories import ReceivedTrajectory
from broker.wire import PolicyVersion
from learner import dispatcher as dispatch
from learner.batching import Group, GroupAssembler, samples_from_groups
from learner.checkpoint import TrainingState, latest_checkpoint
from learner.config import LearnerConfig
from learner.data import load_dataset
from learner.ranks import RankCommands
from learner.steps import GroupDecision, decide_group, staleness_of

log = logging.getLogger(__name__)


class Learner:
    def __init__(
        self, config: LearnerConfig, broker: BrokerConfig, commands: RankCommands, sinks
    ) -> None:
        self.config = config
        self.broker = broker
        self.names = broker.names
        self.commands = commands
        self.sinks = sinks
        self.run_dir = Path(config.run_dir)
        self.assembler = GroupAssembler()
        self.train_queue: asyncio.Queue[Group] = asyncio.Queue()
        self.unacked: dict[str, list[ReceivedTrajectory]] = {}  # trajectory id -> copies
        self.window_ids: list[str] = []  # consumed since the last checkpoint
        self.eval_groups: dict[int, list[Group]] = {}
        self.eval_pending: dict[int, int] = {}  # eval version -> groups still expected
        self.eval_results: dict[int, dict] = {}
        self.counts = Counter()  # trained / dropped:<reason> / eval trajectories
        self.num_released = 0
        self.num_dropped_groups = 0
        self.max_staleness_seen = 0
        self.started = time.monotonic()

    # ---- set-up ----------------------------------------------------------------------------

    async def _connect(self) -> None:
        self.nc = await client.connect(self.broker.url, name="learner")
        self.js = self.nc.jetstream()
        await client.ensure_streams(self.js, self.names, self.broker.stream_limits())
        self.policy = client.PolicyStore(self.js, self.names)

    async def _redeliver_unacked(self) -> None:
        """After a crash, unacked trajectories would wait out the ack timeout; a fresh
        consumer delivers them now (the stream is a work queue: acked ones are gone)."""
        try:
            await self.js.delete_consumer(
                self.names.trajectories_stream, self.names.trajectories_consumer
            )
        except nats.js.errors.NotFoundError:
            pass
        await client.ensure_streams(self.js, self.names, self.broker.stream_limits())

    def _restore(self, state: TrainingState) -> None:
        cursor = state.dataset_cursor
        self.num_released = cursor.get("num_released", 0)
        self.num_dropped_groups = cursor.get("num_dropped_groups", 0)
        self.counts.update(cursor.get("counts", {}))
        self.max_staleness_seen = cursor.get("max_staleness_seen", 0)
        self.eval_results = {int(v): r for v, r in cursor.get("eval_results", {}).items()}
        self.assembler.seen_ids.update(state.trained_ids)

    def _cursor(self) -> dict:
        return {
            "num_released": self.num_released,
            "num_dropped_groups": self.num_dropped_groups,
            "counts": dict(self.counts),
            "max_staleness_seen": self.max_staleness_seen,
            "eval_results": {str(v): r for v, r in self.eval_results.items()},
        }

    # ---- the loop ----------------------------------------------------------------------------

    async def run(self) -> dict:
        cfg = self.config
        await self._connect()
        train_rows = load_dataset(cfg.train_data)
        self.eval_rows = load_dataset(cfg.eval_data) if cfg.eval_data else []
        self.stream = dispatch.PromptStream(
            train_rows,
            run_id=self.names.namespace,
            group_size=cfg.group_size,
            prompts_per_step=cfg.prompts_per_step,
            max_staleness=cfg.max_staleness,
            seed=cfg.seed,
        )
        resume_from = latest_checkpoint(cfg.checkpoint.dir) if cfg.checkpoint.resume else None
        if resume_from is not None:
            state = self.commands.load(resume_from)
            self._restore(state)
            self.sinks.truncate_history(state.version)
            await self._redeliver_unacked()
            log.info("resumed from %s at version %d", resume_from, state.version)
        self.version = self.commands.version
        await self._announce(self.version)
        consumer = asyncio.create_task(self._consume())
        try:
            while self.version < cfg.total_steps:
                await self._maybe_eval(self.version)
                await self._release()
                groups, waited_s = await self._take_groups(cfg.prompts_per_step)
                await self._train(groups, waited_s)
                if self.version % cfg.checkpoint.interval == 0:
                    await self._checkpoint()
            await self._maybe_eval(self.version, final=True)
            await self._wait_for_evals()
            await self._checkpoint()
            summary = await self._done()
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await self.nc.close()
        return summary

    async def _release(self) -> None:
        cfg = self.config
        horizon = min(self.version + cfg.max_staleness + 1, cfg.total_steps)
        allowed = horizon * cfg.prompts_per_step + self.num_dropped_groups
        if allowed <= self.num_released:
            return
        tasks = [
            self.stream.task(i, version=self.version) for i in range(self.num_released, allowed)
        ]
        await client.publish_prompts(self.js, self.names, tasks)
        self.num_released = allowed

    async def _maybe_eval(self, version: int, *, final: bool = False) -> None:
        cfg = self.config
        due = cfg.eval_interval is not None and (final or version % cfg.eval_interval == 0)
        if (
            not due
            or not self.eval_rows
            or version in self.eval_results
            or (version in self.eval_pending)
        ):
            return
        tasks = dispatch.eval_tasks(
            self.eval_rows,
            run_id=self.names.namespace,
            version=version,
            samples_per_prompt=cfg.eval_samples_per_prompt,
        )
        self.eval_pending[version] = len(tasks)
        self.eval_groups[version] = []
        await client.publish_prompts(self.js, self.names, tasks)

    async def _consume(self) -> None:
        consumer = client.TrajectoryConsumer(self.js, self.names)
        while True:
            for received in await consumer.fetch(batch=256, timeout_s=1.0):
                self._on_trajectory(received)
                if received.trajectory.is_eval:
                    await received.ack()  # eval results are recomputed, not checkpointed

    def _on_trajectory(self, received: ReceivedTrajectory) -> None:
        trajectory = received.trajectory
        num_duplicates = self.assembler.num_duplicates
        group = self.assembler.add(trajectory)
        if trajectory.is_eval:
            if group is not None:
                self._on_eval_group(group)
            return
        if self.assembler.num_duplicates > num_duplicates and (
            trajectory.trajectory_id not in self.unacked
        ):
            # Redelivered after a checkpoint already covered it: nothing left to do.
            asyncio.get_running_loop().create_task(received.ack())
            return
        # Acked together with every other copy once a checkpoint covers this id.
        self.unacked.setdefault(trajectory.trajectory_id, []).append(received)
        if group is not None:
            self.train_queue.put_nowait(group)

    async def _take_groups(self, num_groups: int) -> tuple[list[Group], float]:
        """The next `num_groups` trainable groups, dropping (and counting) stale ones."""
        started = time.monotonic()
        taken: list[Group] = []
        while len(taken) < num_groups:
            group = await self.train_queue.get()
            decision = decide_group(
                group, version=self.version, max_staleness=self.config.max_staleness
            )
            ids = [t.trajectory_id for t in group.trajectories]
            self.window_ids.extend(ids)
            if decision.drop_reason is not None:
                self.counts[f"dropped:{decision.drop_reason}"] += len(ids)
                self.num_dropped_groups += 1
                log.info("dropped group %s: %s", group.group_id, decision.drop_reason)
                await self._release()  # a replacement prompt for the dropped group
                continue
            self.counts["dropped:error"] += len(ids) - len(decision.group.trajectories)
            taken.append(decision.group)
        return taken, time.monotonic() - started

    async def _train(self, groups: list[Group], waited_s: float) -> None:
        cfg = self.config
        samples = samples_from_groups(
            groups,
            estimator=cfg.algorithm.advantage_estimator,
            normalize_std=cfg.algorithm.normalize_std,
        )
        staleness = [staleness_of(g, self.version) for g in groups]
        self.max_staleness_seen = max([self.max_staleness_seen, *staleness])
        started = time.monotonic()
        metrics = await asyncio.to_thread(self.commands.train, samples)
        train_s = time.monotonic() - started
        self.counts["trained"] += len(samples)
        self.version = self.commands.version
        started = time.monotonic()
        report = await asyncio.to_thread(self.commands.broadcast_weights, self.version)
        broadcast_s = time.monotonic() - started
        await self._announce(self.version)
        num_tokens = sum(s.num_tokens for s in samples)
        self.sinks.record(
            {
                "kind": "train",
                "step": self.version,
                "version": self.version,
                "wall_s": time.monotonic() - self.started,
                "reward_mean": sum(sum(g.rewards) for g in groups) / max(1, len(samples)),
                "staleness": staleness,
                "staleness_max_batch": max(staleness),
                "max_staleness_seen": self.max_staleness_seen,
                "tokens_per_s": num_tokens / max(train_s, 1e-9),
                "num_tokens": num_tokens,
                "wait_data_s": waited_s,
                "train_s": train_s,
                "broadcast_s": broadcast_s,
                "broadcast_receivers": report.get("num_receivers", 0),
                "published": self._num_consumed(),
                "trained": self.counts["trained"],
                "dropped": self._num_dropped(),
                **{f"train/{k}": v for k, v in metrics.items()},
            },
            groups=groups,
        )

    def _num_dropped(self) -> int:
        return sum(n for k, n in self.counts.items() if k.startswith("dropped:"))

    def _num_consumed(self) -> int:
        return self.counts["trained"] + self._num_dropped()

    async def _announce(self, version: int) -> None:
        snapshot = self.commands.snapshot_path(version)
        await self.policy.publish(
            PolicyVersion(
                version=version,
                published_at=time.time(),
                snapshot_path=str(snapshot[0]) if snapshot else "",
                snapshot_version=snapshot[1] if snapshot else -1,
                broadcast_addr=self.commands.broadcast_addr,
            )
        )

    async def _checkpoint(self) -> None:
        state = TrainingState(dataset_cursor=self._cursor(), trained_ids=list(self.window_ids))
        await asyncio.to_thread(self.commands.save, state)
        # The checkpoint now covers these: acknowledge them (synchronously, so that a crash
        # right after cannot leave an ack unsent for a trajectory the checkpoint trained).
        for trajectory_id in self.window_ids:
            for received in self.unacked.pop(trajectory_id, []):
                await received.msg.ack_sync()
                if received.claim is not None:
                    await received.consumer.delete_claim(received.claim)
        self.window_ids = []

    # ---- eval ------------------------------------------------------------------------------

    def _on_eval_group(self, group: Group) -> None:
        version = int(group.group_id.split("-eval", 1)[1].split("-", 1)[0])
        if version not in self.eval_pending:
            return  # an eval of an earlier incarnation of this run
        self.eval_groups[version].append(group)
        self.eval_pending[version] -= 1
        self.counts["eval"] += len(group.trajectories)
        if self.eval_pending[version] == 0:
            del self.eval_pending[version]
            groups = self.eval_groups.pop(version)
            self.eval_results[version] = self.sinks.record_eval(
                version, groups, time.monotonic() - self.started
            )

    async def _wait_for_evals(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.eval_pending and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        if self.eval_pending:
            log.warning(
                "evals at versions %s did not finish in %.0fs", sorted(self.eval_pending), timeout_s
            )

    async def _done(self) -> dict:
        info = await self.js.stream_info(self.names.trajectories_stream)
        summary = {
            "kind": "done",
            "wall_s": time.monotonic() - self.started,
            "version": self.version,
            # Every training trajectory ever stored in the stream (deduplicated).
            "published": info.state.last_seq - self.counts["eval"],
            "trained": self.counts["trained"],
            "dropped": self._num_dropped(),
            "dropped_by_reason": {
                k.split(":", 1)[1]: n
                for k, n in self.counts.items()
                if k.startswith("dropped:") and n
            },
            "max_staleness_seen": self.max_staleness_seen,
            "eval_pass_at_1": {str(v): r["pass_at_1"] for v, r in self.eval_results.items()},
        }
        self.sinks.record(summary)
        (self.run_dir / "learner_done.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


__all__ = ["Learner", "GroupDecision"]
