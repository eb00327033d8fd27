"""Rank 0's uploads of run artifacts to the bucket, in a background thread, and the resume
from the bucket (docs/storage.md).

    RankCommands.save ──checkpoint_saved──►┐ pending (checkpoints, evals: in order;
    RankCommands.write_snapshot ──────────►│ snapshot: newest only)
    Reporter.record_eval ──evals_written──►┘        │ one worker thread
                                                    ▼
              upload + verify (common/s3.py) ─► prune the bucket (keep_*) ─► prune local
              checkpoints that are verified in the bucket (learner.checkpoint.keep)

With a bucket, the trajectories a checkpoint covers are acked only once that checkpoint is
verified there (`hold_acks`, `take_durable_acks`): a learner resuming on a fresh machine
starts from the bucket's newest checkpoint and needs every trajectory it does not cover.

Nothing here blocks the training loop: the hooks only queue, except the release write-ahead
(`dispatcher_written`, one small PUT per release, awaited in a thread before the prompts
are published). A checkpoint that failed to
upload stays on disk (it is never pruned unverified) and is tried again after the next save
and at the next start. The snapshot actors are told about (`announced_snapshot`) is the
newest verified upload (the local one only until there is one).
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections import OrderedDict
from pathlib import Path

from common.objectstore import (
    DISPATCHER_FILE,
    local_prune_plan,
    prune_plan,
    resume_source,
)
from common.s3 import ObjectStore, StorageError, timed_upload
from common.storage_config import StorageConfig
from learner.trainer.checkpoint import (
    STATE_FILE,
    checkpoint_dir,
    latest_checkpoint,
    read_training_state,
)
from weights.formats.delta_log import delta_version

log = logging.getLogger(__name__)


def local_checkpoint_steps(root: Path) -> dict[int, Path]:
    """Step -> directory of every complete local checkpoint (`step_<N>/state.json`)."""
    if not root.is_dir():
        return {}
    return {
        int(p.name.removeprefix("step_")): p
        for p in root.glob("step_*")
        if p.name.removeprefix("step_").isdigit() and (p / STATE_FILE).is_file()
    }


def restore_from_bucket(store: ObjectStore, layout, checkpoint_root: Path) -> int | None:
    """Before resuming: if the bucket's newest complete checkpoint is newer than every local
    one, download it into `checkpoint_root` (state.json last). Also fetch the release
    write-ahead when there is none locally. Returns the step downloaded, or None."""
    complete, _ = store.artifacts(layout, "checkpoint")
    source = resume_source(local_checkpoint_steps(checkpoint_root), complete)
    dispatcher = checkpoint_root / DISPATCHER_FILE
    if not dispatcher.is_file() and (data := store.get_bytes(layout.dispatcher_key)) is not None:
        checkpoint_root.mkdir(parents=True, exist_ok=True)
        dispatcher.write_bytes(data)
    if source is None or source[0] == "local":
        return None
    step = source[1]
    store.download_artifact(
        layout.directory("checkpoint", step), checkpoint_dir(checkpoint_root, step)
    )
    log.info(
        "downloaded checkpoint %d from %s", step, layout.url(layout.directory("checkpoint", step))
    )
    return step


def durable_acks(
    held: list[tuple[int, list[str]]], uploaded: set[int], *, everything: bool = False
) -> list[tuple[int, list[str]]]:
    """The leading windows of `held` (checkpoint step, ids; oldest first) that the newest
    uploaded checkpoint covers: a checkpoint covers its own window and all before it."""
    if everything:
        return list(held)
    covered = max((i for i, (step, _) in enumerate(held) if step in uploaded), default=-1)
    return held[: covered + 1]


class ArtifactSync:
    """Queue of uploads and the thread that works through it (rank 0 only)."""

    def __init__(
        self,
        store: ObjectStore,
        config: StorageConfig,
        layout,
        *,
        checkpoint_root: Path,
        keep_local: int,
    ) -> None:
        self.store, self.config, self.layout = store, config, layout
        self.checkpoint_root = Path(checkpoint_root)
        self.keep_local = keep_local
        self.uploaded: set[int] = set()  # checkpoint steps verified in the bucket
        self.snapshot: tuple[str, int] | None = None  # (s3:// URL, version) verified
        self.num_bytes = 0
        self.upload_s = 0.0
        self.num_failures = 0
        self._pending: OrderedDict[str, tuple] = OrderedDict()
        self._cond = threading.Condition()
        self._current: str | None = None  # the slot being uploaded now
        self._held_acks: list[tuple[int, list[str]]] = []  # (checkpoint step, ids), in order
        self._closing = False
        self._thread = threading.Thread(target=self._work, name="artifact-uploads", daemon=True)

    def start(self, resumed_version: int) -> None:
        """Learn what the bucket holds, queue local checkpoints it lacks, start the thread.

        Snapshots newer than `resumed_version` were written by a run that went past the
        checkpoint this one resumes from: their weights belong to an abandoned future (this
        run trains those versions again, differently), so they are deleted, never announced."""
        complete, _ = self.store.artifacts(self.layout, "checkpoint")
        self.uploaded = set(complete)
        snapshots, _ = self.store.artifacts(self.layout, "snapshot")
        for step in [s for s in snapshots if s > resumed_version]:
            self.store.delete_artifact(self.layout.directory("snapshot", step))
            log.info("deleted snapshot %d from the bucket: newer than the resumed version", step)
        self._prune_deltas(lambda v: v > resumed_version)  # of the same abandoned future
        snapshots = [s for s in snapshots if s <= resumed_version]
        if snapshots:
            self.snapshot = (
                self.layout.url(self.layout.directory("snapshot", snapshots[-1])),
                snapshots[-1],
            )
        self._queue_missing_checkpoints()
        self._thread.start()

    # ---- hooks (any thread; they only queue) -------------------------------------------------

    def checkpoint_saved(self, path: Path, step: int) -> None:
        if self.config.upload_checkpoints:
            self._put(f"checkpoint/{step}", ("checkpoint", Path(path), step))
            self._queue_missing_checkpoints()
        else:
            self._prune_local(uploaded=set(local_checkpoint_steps(self.checkpoint_root)))

    def snapshot_written(self, path: Path, version: int) -> None:
        if self.config.upload_snapshots:
            self._put("snapshot", ("snapshot", Path(path), version))  # newest only

    def delta_written(self, path: Path, version: int) -> None:
        """The weights log's delta file of `version` (learner.snapshot_deltas): uploaded in
        order, beside the snapshots."""
        if self.config.upload_snapshots:
            self._put(f"delta/{version}", ("delta", Path(path), version))

    @property
    def deltas_url(self) -> str | None:
        """Where the weights log is in the bucket (None when snapshots stay local)."""
        return self.layout.url(self.layout.deltas_root) if self.config.upload_snapshots else None

    def evals_written(self, directory: Path, version: int) -> None:
        if self.config.upload_evals:
            self._put(f"evals/{version}", ("evals", Path(directory), version))

    def dispatcher_written(self, path: Path) -> None:
        """Uploads now (call it in a thread), not queued: the release write-ahead must be in
        the bucket before the prompts go out, or a learner resuming on a fresh machine would
        release their task ids again, which JetStream drops as duplicates, and wait forever
        for their groups. A failure is logged; the local write-ahead still stands."""
        try:
            self.store.put_bytes(self.layout.dispatcher_key, Path(path).read_bytes())
        # Network boundary: only a resume on another machine needs this copy.
        except StorageError as e:
            self.num_failures += 1
            log.error("upload of %s failed: %s", path, e)

    def hold_acks(self, step: int, ids: list[str]) -> None:
        """Trajectory ids checkpoint `step` covers, to ack once it is in the bucket."""
        self._held_acks.append((step, list(ids)))

    @property
    def unacked_ids(self) -> list[str]:
        return [i for _, ids in self._held_acks for i in ids]

    def take_durable_acks(self) -> list[str]:
        """The held ids covered by a checkpoint now verified in the bucket (all of them
        when checkpoints are not uploaded), removed from the held ones."""
        done = durable_acks(
            self._held_acks, self.uploaded, everything=not self.config.upload_checkpoints
        )
        self._held_acks = self._held_acks[len(done) :]
        return [i for _, ids in done for i in ids]

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait (up to `timeout_s`, default the config's) until nothing is queued."""
        timeout_s = self.config.drain_timeout_s if timeout_s is None else timeout_s
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._pending and self._current is None, timeout_s
            )

    def announced_snapshot(self, local: tuple[Path, int] | None) -> tuple[str, int] | None:
        """What to tell actors: the newest verified upload (actors on other machines cannot
        read a local path; a slightly older snapshot is caught up by the broadcast), or the
        local snapshot before anything is uploaded."""
        if self.snapshot is not None:
            return self.snapshot
        return (str(local[0]), local[1]) if local is not None else None

    def close(self, timeout_s: float | None = None) -> bool:
        """Finish the queued uploads (up to `timeout_s`, default the config's); True when all
        were done."""
        timeout_s = self.config.drain_timeout_s if timeout_s is None else timeout_s
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        drained = self.wait_idle(timeout_s)
        if not drained:
            log.warning("uploads still queued at exit: %s", list(self._pending))
        log.info(
            "uploads: %.1f MB in %.1fs, %d failed",
            self.num_bytes / 1e6,
            self.upload_s,
            self.num_failures,
        )
        return drained

    # ---- the worker ---------------------------------------------------------------------------

    def _put(self, slot: str, job: tuple) -> None:
        with self._cond:
            self._pending[slot] = job
            self._cond.notify_all()

    def _queue_missing_checkpoints(self) -> None:
        for step, path in sorted(local_checkpoint_steps(self.checkpoint_root).items()):
            slot = f"checkpoint/{step}"
            if step not in self.uploaded and self.config.upload_checkpoints:
                with self._cond:
                    if slot != self._current:
                        self._pending.setdefault(slot, ("checkpoint", path, step))
                        self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closing)
                if not self._pending:
                    return
                self._current, job = self._pending.popitem(last=False)
            try:
                self._run(*job)
            # Network boundary: botocore retried already; the artifact stays on disk (a
            # checkpoint is never pruned unverified) and is tried again later.
            except (StorageError, OSError) as e:
                if job[1].exists():
                    self.num_failures += 1
                    log.error("upload of %s %s failed: %s", job[0], job[2], e)
                else:  # a snapshot superseded (and removed) while it went up
                    log.info("upload of %s %s abandoned: %s is gone", job[0], job[2], job[1])
            finally:
                with self._cond:
                    self._current = None
                    self._cond.notify_all()

    def _run(self, kind: str, path: Path, step: int) -> None:
        if kind == "evals":
            for file in sorted(p for p in path.iterdir() if p.is_file() and p.suffix == ".jsonl"):
                entry = self.store.upload_file(file, self.layout.eval_key(step, file.name))
                self.num_bytes += entry.size
        elif kind == "checkpoint":
            if not (path / STATE_FILE).is_file():
                return  # pruned or never completed: nothing to upload
            self._upload(path, "checkpoint", step)
            self.uploaded.add(step)
            self._prune_bucket("checkpoint", self.config.keep_checkpoints)
            self._prune_local(uploaded=self.uploaded)
        elif kind == "snapshot":
            if not path.is_dir():
                return  # superseded and removed before its turn came
            self._upload(path, "snapshot", step)
            self.snapshot = (self.layout.url(self.layout.directory("snapshot", step)), step)
            self._prune_bucket("snapshot", self.config.keep_snapshots)
            self._prune_deltas(lambda v: v <= step)  # the snapshot is the newer keyframe
        elif kind == "delta":
            if path.is_file():  # else a newer snapshot replaced it before its turn came
                self.num_bytes += self.store.upload_file(path, self.layout.delta_key(step)).size

    def _upload(self, path: Path, kind: str, step: int) -> None:
        manifest, seconds = timed_upload(
            self.store, path, self.layout.directory(kind, step), kind=kind, step=step
        )
        self.num_bytes += manifest.num_bytes
        self.upload_s += seconds

    def _prune_bucket(self, kind: str, keep: int | None) -> None:
        complete, incomplete = self.store.artifacts(self.layout, kind)
        for step in prune_plan(complete, incomplete, keep):
            self.store.delete_artifact(self.layout.directory(kind, step))
            log.info("deleted %s %d from the bucket", kind, step)

    def _prune_deltas(self, doomed) -> None:
        """Delete the weights log's files whose version `doomed(version)` says."""
        keys = self.store.listing(self.layout.deltas_root)
        self.store.delete_keys(
            sorted(k for k in keys if doomed(delta_version(k.rsplit("/", 1)[-1]) or 0))
        )

    def _prune_local(self, *, uploaded: set[int]) -> None:
        local = local_checkpoint_steps(self.checkpoint_root)
        for step in local_prune_plan(local, uploaded, self.keep_local):
            shutil.rmtree(local[step], ignore_errors=True)


def open_artifacts(
    storage: StorageConfig, *, run_name: str, checkpoint_root: Path, keep_local: int, resume: bool
) -> ArtifactSync:
    """The learner's bucket at start-up: download a newer checkpoint to resume from (when
    resuming), then start the upload thread."""
    store = ObjectStore(storage)
    layout = storage.layout(run_name)
    if resume and storage.resume_from_bucket:
        restore_from_bucket(store, layout, Path(checkpoint_root))
    sync = ArtifactSync(
        store, storage, layout, checkpoint_root=Path(checkpoint_root), keep_local=keep_local
    )
    newest = latest_checkpoint(checkpoint_root) if resume else None
    sync.start(resumed_version=read_training_state(newest).version if newest else 0)
    return sync
