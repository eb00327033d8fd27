"""Rank 0's handle on every learner rank, and the followers' side of it.

Rank 0 owns all I/O (bus, weights to the actors, snapshots); the FSDP2 collectives —
train step, gathering full weights, checkpoint save and load — must run on every rank in
the same order. So rank 0 calls `RankCommands`, which broadcasts each command (a small
pickled tuple, plus the batch for a train step) before running its own part; the other
ranks sit in `follow()` and mirror it. With one rank nothing is broadcast.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch.distributed as dist

from learner.checkpoint import TrainingState, prune_checkpoints
from learner.trainer import Trainer
from weights.snapshot import write_snapshot

log = logging.getLogger(__name__)


def _broadcast_command(command: str, payload=None):
    if dist.is_initialized() and dist.get_world_size() > 1:
        box = [(command, payload)]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return command, payload


class RankCommands:
    def __init__(
        self,
        trainer: Trainer,
        *,
        checkpoint_dir: str,
        keep: int,
        snapshot_dir: Path,
        snapshot_interval: int,
        sender=None,
    ) -> None:
        self.trainer = trainer
        self.checkpoint_dir = checkpoint_dir
        self.keep = keep
        self.snapshot_dir = snapshot_dir
        self.snapshot_interval = snapshot_interval
        self.sender = sender
        self._snapshot: tuple[Path, int] | None = None

    @property
    def version(self) -> int:
        return self.trainer.version

    @property
    def step(self) -> int:
        return self.trainer.step

    @property
    def broadcast_addr(self) -> str:
        if self.sender is None:
            return ""
        return f"{self.sender.config.store_host}:{self.sender.config.store_port}"

    def train(self, samples) -> dict[str, float]:
        _broadcast_command("train", samples)
        return self.trainer.train_step(samples)

    def save(self, state: TrainingState) -> Path:
        _broadcast_command("save", state)
        path = self.trainer.save(self.checkpoint_dir, state)
        prune_checkpoints(self.checkpoint_dir, self.keep)
        return path

    def load(self, path: Path) -> TrainingState:
        _broadcast_command("load", str(path))
        state = self.trainer.load(path)
        # Actors that start now know only the initial weights: give them these.
        self.write_snapshot(self.trainer.version, self.trainer.full_weights())
        return state

    def publish_weights(self, version: int, snapshot: bool = False) -> dict:
        """Send version `version` to the actors (when broadcasting); every
        `snapshot_interval` versions, and when `snapshot`, also write it to disk for actors
        that join later. Returns the broadcast report (`num_receivers` 0 when nobody was
        sent anything)."""
        snapshot = snapshot or version % self.snapshot_interval == 0
        if self.sender is None and not snapshot:
            return {"num_receivers": 0}  # nothing to gather the full weights for
        _broadcast_command("weights")
        named = self.trainer.full_weights()
        if snapshot:
            named = list(named)
            self.write_snapshot(version, named)
        report = {"num_receivers": 0}
        if self.sender is not None:
            result = self.sender.broadcast(version, named)
            report = {
                "num_receivers": result.num_receivers,
                "transfer_s": result.transfer_s,
                "join_s": result.join_s,
                "ok": result.ok,
            }
        for _ in named:  # every rank must exhaust the gather, even with nobody listening
            pass
        return report

    def write_snapshot(self, version: int, named) -> Path:
        """Write version `version` for actors that join later; the previous snapshot is
        removed once the new one is in place."""
        final = write_snapshot(self.snapshot_dir, version, named)
        previous, self._snapshot = self._snapshot, (final, version)
        if previous is not None and previous[0] != final:
            shutil.rmtree(previous[0], ignore_errors=True)
        return final

    @property
    def snapshot(self) -> tuple[Path, int] | None:
        """(directory, version) of the newest snapshot written, or None."""
        return self._snapshot

    def stop(self) -> None:
        _broadcast_command("stop")


def follow(trainer: Trainer, *, checkpoint_dir: str) -> None:
    """Ranks > 0: mirror rank 0's commands until it says stop."""
    while True:
        command, payload = _broadcast_command("?")
        if command == "train":
            trainer.train_step(payload)
        elif command == "weights":
            for _ in trainer.full_weights():
                pass
        elif command == "save":
            trainer.save(checkpoint_dir, payload)
        elif command == "load":
            trainer.load(payload)
            for _ in trainer.full_weights():  # rank 0 writes a snapshot after loading
                pass
        elif command == "stop":
            return
        else:
            raise AssertionError(f"unknown learner command {command!r}")
