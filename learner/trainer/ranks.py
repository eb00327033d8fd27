"""Rank 0's handle on every learner rank, and the followers' side of it.

Rank 0 owns all I/O (bus, weights to the actors, snapshots); the FSDP2 collectives —
train step, gathering full weights, checkpoint save and load — must run on every rank in
the same order. So rank 0 calls `RankCommands`, which broadcasts each command (a small
pickled tuple, plus the batch for a train step) before running its own part; the other
ranks sit in `follow()` and mirror it. With one rank nothing is broadcast.

Commands travel over a CPU gloo group of their own (`command_group`), with a long timeout:
rank 0 may wait on the bus for minutes or hours (first trajectories, evals, the drain)
while the others wait for the next command, and on NCCL's 10-minute collective timeout
they would be torn down. NCCL keeps its short timeout for the collectives every rank is
actively in. A rank 0 that dies closes its gloo connections: the others fail at once.
"""

from __future__ import annotations

import logging
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from learner.trainer.checkpoint import TrainingState, prune_checkpoints
from learner.trainer.trainer import Trainer
from weights.formats.adapter import AdapterSnapshotWriter
from weights.formats.delta_log import DeltaLogWriter
from weights.formats.snapshot import SnapshotWriter

log = logging.getLogger(__name__)


def command_group(timeout_s: float):
    """The gloo group rank 0's commands travel on (None with one rank). Every rank must
    call this at the same point, right after init_process_group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


def _broadcast_command(command: str, payload=None, group=None):
    if dist.is_initialized() and dist.get_world_size() > 1:
        box = [(command, payload)]
        dist.broadcast_object_list(box, src=0, group=group)
        return box[0]
    return command, payload


@dataclass(eq=False)
class RankCommands:
    trainer: Trainer
    _: KW_ONLY
    checkpoint_dir: str
    keep: int
    """Checkpoints kept (older ones are pruned)."""
    snapshot_dir: Path
    snapshot_interval: int
    sender: Any = None
    """The weights/ sender broadcasting new weights to the engines; None: no broadcast."""
    group: Any = None
    """The gloo group commands travel on (`command_group`); None with one rank."""
    artifacts: Any = None
    """learner.artifacts.ArtifactSync when a bucket is set."""
    snapshot_deltas: bool = False
    """The weights log (`learner.snapshot_deltas`): every version between snapshots as a
    delta file in `<snapshot_dir>/deltas`, for actors that follow the object store."""
    _snapshot: tuple[Path, int] | None = field(default=None, init=False)
    delta_log: DeltaLogWriter | None = field(default=None, init=False)
    _saving: Future | None = field(default=None, init=False)
    _saver: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="checkpoint"),
        init=False,
    )

    def __post_init__(self) -> None:
        if self.snapshot_deltas:
            self.delta_log = DeltaLogWriter(Path(self.snapshot_dir) / "deltas")

    def _command(self, command: str, payload=None) -> None:
        # A checkpoint being saved reads the weights and runs collectives: every command
        # after it waits, so that nothing changes them meanwhile and every rank runs the
        # collectives in one order (the others save in `follow`, before their next command).
        self.wait_saved()
        _broadcast_command(command, payload, self.group)

    def _weights(self):
        """Full weights on rank 0, one tensor at a time, in the dtype they go out in (the
        learner's compute dtype, which the engines share: bf16 halves the bytes)."""
        return self.trainer.full_weights(dtype=self.trainer.weights_dtype)

    @property
    def version(self) -> int:
        return self.trainer.version

    @property
    def step(self) -> int:
        return self.trainer.step

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding: a token id must be below it."""
        return self.trainer.model.get_input_embeddings().num_embeddings

    @property
    def broadcast_addr(self) -> str:
        if self.sender is None:
            return ""
        return f"{self.sender.config.store_host}:{self.sender.config.store_port}"

    def train(self, samples, algorithm=None) -> dict[str, float]:
        self._command("train", (samples, algorithm))
        return self.trainer.train_step(samples, algorithm)

    def save(self, state: TrainingState) -> Future[Path]:
        """Start saving a checkpoint of the current weights and return at once: the caller
        goes on (waiting for data, say) while it is written, from the live tensors, no copy.
        Every later command waits for it first (`wait_saved`)."""
        self._command("save", state)
        self._saving = self._saver.submit(self._save, state)
        return self._saving

    def _save(self, state: TrainingState) -> Path:
        path = self.trainer.save(self.checkpoint_dir, state)
        if self.artifacts is not None:  # uploads it, then prunes what the bucket holds
            self.artifacts.checkpoint_saved(path, state.step)
        else:
            prune_checkpoints(self.checkpoint_dir, self.keep)
        return path

    def wait_saved(self) -> None:
        """Wait for the checkpoint being saved, if any (its error, if it failed)."""
        saving, self._saving = self._saving, None
        if saving is not None:
            saving.result()

    def load(self, path: Path) -> TrainingState:
        self._command("load", str(path))
        state = self.trainer.load(path)
        if self.delta_log is not None:  # the versions after the checkpoint's are undone
            self.delta_log.forget()
            self.delta_log.prune(above=self.trainer.version)
        # Actors that start now know only the initial weights: give them these.
        self.write_snapshot(self.trainer.version, self._weights())
        return state

    def start_weights_log(self) -> None:
        """With the weights log, before the first announcement: a snapshot of the current
        version (the chain's first keyframe), and no delta past it (a history a resumed
        learner rolled back)."""
        if self.delta_log is None:
            return
        self.delta_log.prune(above=self.trainer.version)
        if self._snapshot is None or self._snapshot[1] != self.trainer.version:
            self.snapshot_current()

    def publish_weights(self, version: int, snapshot: bool = False) -> dict:
        """Send version `version` to the actors (when broadcasting); every
        `snapshot_interval` versions, and when `snapshot`, also write it to disk for actors
        that join later. Returns the broadcast report (`num_receivers` 0 when nobody was
        sent anything)."""
        snapshot = snapshot or version % self.snapshot_interval == 0
        if self.sender is None and not snapshot and self.delta_log is None:
            return {"num_receivers": 0}  # nothing to gather the full weights for
        self._command("weights")
        named = self._logged(version, self._weights())
        # The snapshot is written from the same stream as the broadcast, shard by shard:
        # rank 0 never holds the whole model.
        writer = self._snapshot_writer(version) if snapshot else None
        if writer is not None:
            named = writer.tee(named)
        report = {"num_receivers": 0}
        if self.sender is not None:
            result = self.sender.broadcast(version, named)
            report = {
                "num_receivers": result.num_receivers,
                "transfer_s": result.transfer_s,
                "join_s": result.join_s,
                "ok": result.ok,
                "num_bytes": result.num_bytes,  # with LoRA: the adapter's bytes
                "raw_bytes": result.raw_bytes,  # what a keyframe sends (weight_sync.delta)
                "keyframe": result.keyframe,
            }
        for _ in named:  # every rank must exhaust the gather, even with nobody listening
            pass
        if writer is not None:
            self._keep_snapshot(writer.finish(), version)
        if self.delta_log is not None:
            report["log_bytes"] = self.delta_log.num_bytes
            if self.artifacts is not None and self.delta_log.last_path is not None:
                self.artifacts.delta_written(self.delta_log.last_path, version)
        return report

    def engines_behind(self) -> bool:
        """Whether an engine of the broadcast did not get the current version's round."""
        return self.sender is not None and self.sender.members_behind()

    def snapshot_current(self) -> Path:
        """Write a snapshot of the current weights (all ranks gather them)."""
        self._command("weights")
        return self.write_snapshot(self.trainer.version, self._weights())

    def write_snapshot(self, version: int, named) -> Path:
        """Write version `version` for actors that join later, as the tensors arrive; the
        previous snapshot is removed once the new one is in place."""
        writer = self._snapshot_writer(version)
        for _ in writer.tee(self._logged(version, named)):
            pass
        final = writer.finish()
        self._keep_snapshot(final, version)
        return final

    def _logged(self, version: int, named):
        """`named`, written to the weights log on the way when it is on and does not hold
        `version` already (a snapshot of the version just published)."""
        if self.delta_log is None or self.delta_log.version == version:
            return named
        return self.delta_log.tee(version, named)

    @property
    def deltas_path(self) -> str:
        """Where the weights log is, to announce ("" when off): in the bucket when
        snapshots go there (actors elsewhere read the same place), else the directory."""
        if self.delta_log is None:
            return ""
        url = self.artifacts.deltas_url if self.artifacts is not None else None
        return url or str(self.delta_log.directory)

    def _snapshot_writer(self, version: int) -> SnapshotWriter:
        """Full weights in HF format, or with LoRA the adapter as a PEFT directory."""
        adapter_config = self.trainer.adapter_config
        if adapter_config is not None:
            return AdapterSnapshotWriter(self.snapshot_dir, version, adapter_config)
        return SnapshotWriter(self.snapshot_dir, version)

    def _keep_snapshot(self, final: Path, version: int) -> None:
        previous, self._snapshot = self._snapshot, (final, version)
        if previous is not None and previous[0] != final:
            shutil.rmtree(previous[0], ignore_errors=True)
        if self.delta_log is not None:  # the snapshot is the newer keyframe
            self.delta_log.prune(through=version)
        if self.artifacts is not None:
            self.artifacts.snapshot_written(final, version)

    @property
    def snapshot(self) -> tuple[Path | str, int] | None:
        """(directory or s3:// URL, version) of the snapshot to announce, or None: the
        newest written, or its verified upload when a bucket is configured."""
        if self.artifacts is not None:
            return self.artifacts.announced_snapshot(self._snapshot)
        return self._snapshot

    def stop(self) -> None:
        self._command("stop")
        self._saver.shutdown()


def follow(trainer: Trainer, *, checkpoint_dir: str, group=None) -> None:
    """Ranks > 0: mirror rank 0's commands until it says stop."""
    while True:
        command, payload = _broadcast_command("?", group=group)
        if command == "train":
            trainer.train_step(*payload)
        elif command == "weights":
            for _ in trainer.full_weights(dtype=trainer.weights_dtype):
                pass
        elif command == "save":
            trainer.save(checkpoint_dir, payload)
        elif command == "load":
            trainer.load(payload)
            for _ in trainer.full_weights(dtype=trainer.weights_dtype):  # rank 0's snapshot
                pass
        elif command == "stop":
            return
        else:
            raise AssertionError(f"unknown learner command {command!r}")
