"""The learner loop's checkpoints: which trajectory ids each covers, the save running beside
the loop, and the acks it allows.

    save():   the ids taken since the last checkpoint (and the eval ids) go into its
              TrainingState; the save starts (rank 0 writes in a thread, every rank its own
              shards) and the loop goes on: releases, evals, the next step's wait for data
    saved():  before anything changes the weights (the next train step) and at the end:
              wait for the save, then ack what it covers (with a bucket: hold those acks
              until the upload is verified, learner/artifacts.py)

The save reads the live weights and optimizer state, no copy (a copy of a 0.5B model's
training state is 6 GB): nothing changes them until `saved()` returns, and RankCommands
makes any other command wait for it too. So a save costs the loop only what the next
step's wait for data does not hide. A crash mid-save leaves a directory without its
state file, which resume ignores; its ids were not acked, so they are redelivered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from learner.trainer.checkpoint import STATE_FILE, TrainingState, checkpoint_dir

log = logging.getLogger(__name__)


class Checkpoints:
    def __init__(self, commands, *, root: str, artifacts=None, checkpointed_version: int = -1):
        self.commands = commands
        self.root = root
        self.artifacts = artifacts  # learner.artifacts.ArtifactSync when a bucket is set
        self.window_ids: list[str] = []
        """Trajectory ids taken since the last checkpoint: the next one covers them."""
        self.checkpointed_version = checkpointed_version
        self.saving: asyncio.Task | None = None

    async def save(self, *, version: int, intake, cursor: Callable[[], dict], ledger) -> None:
        """Start a checkpoint of `version` unless nothing is new since the last one."""
        await self.saved()  # one at a time
        path = checkpoint_dir(self.root, self.commands.step)
        if (path / STATE_FILE).is_file():
            # Never overwrite a complete checkpoint in place (a crash mid-save would leave
            # neither); what it misses stays unacked and is redelivered to the next run.
            if version != self.checkpointed_version or self.window_ids:
                log.warning("checkpoint %s exists; not saving over it", path)
            return
        # Eval trajectories count, and are acked, with the checkpoint that records them.
        self.window_ids.extend(new_evals := intake.take_eval_ids())
        ledger.num_eval_trajectories += len(new_evals)
        if version == self.checkpointed_version and not self.window_ids:
            return  # nothing new since the last one
        # With a bucket, ids of checkpoints not yet verified there are still unacked: this
        # checkpoint covers them too (a resume from it must skip them when redelivered).
        unacked = self.artifacts.unacked_ids if self.artifacts is not None else []
        covered, self.window_ids = self.window_ids, []
        state = TrainingState(dataset_cursor=cursor(), trained_ids=unacked + covered)
        self.checkpointed_version = version
        started = time.monotonic()
        written = await asyncio.to_thread(self.commands.save, state)
        self.saving = asyncio.create_task(self._then_ack(written, state, covered, intake, started))

    async def _then_ack(self, written, state, covered: list[str], intake, started: float):
        path = await asyncio.wrap_future(written)
        log.info("checkpoint %s written in %.1f s", path, time.monotonic() - started)
        if self.artifacts is not None:
            # Acked only once the checkpoint is in the bucket: a fresh machine resumes from
            # the bucket, and needs every trajectory its checkpoint does not cover.
            self.artifacts.hold_acks(state.step, covered)
            return
        # The checkpoint covers these now. A failed ack keeps its id in the next window,
        # so the next checkpoint covers it again.
        failed = await intake.ack(covered)
        self.window_ids = failed + self.window_ids

    async def saved(self) -> float:
        """Wait for the checkpoint being saved and its acks; the seconds waited."""
        if self.saving is None:
            return 0.0
        started = time.monotonic()
        saving, self.saving = self.saving, None
        await saving
        return time.monotonic() - started

    async def ack_uploaded(self, intake, *, wait: bool = False) -> None:
        """Ack what checkpoints verified in the bucket cover (`wait`: for the queued
        uploads first, bounded by `storage.drain_timeout_s`)."""
        if self.artifacts is None:
            return
        if wait:
            await asyncio.to_thread(self.artifacts.wait_idle)
        failed = await intake.ack(self.artifacts.take_durable_acks())
        self.window_ids = failed + self.window_ids  # covered by the next checkpoint again
