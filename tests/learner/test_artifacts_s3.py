"""Checkpoints in a real S3-compatible bucket (moto's server, its own process on loopback):
uploaded in the background and verified, local copies pruned only once the bucket holds
them, resume from the bucket on a machine with no local checkpoint, and an upload killed
with SIGKILL that must not leave a checkpoint that looks complete."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.s3 import ObjectStore
from learner.artifacts import local_checkpoint_steps, open_artifacts, restore_from_bucket
from learner.trainer.checkpoint import (
    TrainingState,
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)

REPO = Path(__file__).resolve().parents[2]


def _parts(width: int = 64, *, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


def _train_and_save(root: Path, parts, step: int) -> Path:
    """One optimizer step (so the optimizer has state), then a real DCP checkpoint."""
    model, optimizer, scheduler = parts
    model(torch.randn(8, model[0].in_features)).square().mean().backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    state = TrainingState(step=step, version=step, trained_ids=[f"t{step}"])
    return save_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler, state=state)


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_checkpoints_go_up_local_copies_are_pruned_and_a_fresh_machine_resumes(
    s3_storage, tmp_path
):
    storage = s3_storage(keep_checkpoints=2)
    root = tmp_path / "checkpoints"
    sync = open_artifacts(storage, run_name="r1", checkpoint_root=root, keep_local=1, resume=True)
    parts = _parts()
    for step in (2, 4, 6):
        sync.checkpoint_saved(_train_and_save(root, parts, step), step)  # only queues
    (root / "dispatcher.json").write_text('{"num_released": 14}')
    sync.dispatcher_written(root / "dispatcher.json")
    assert sync.close(timeout_s=120)
    assert sync.num_failures == 0

    store, layout = ObjectStore(storage), storage.layout("r1")
    assert store.artifacts(layout, "checkpoint") == ([4, 6], [])  # keep_checkpoints = 2
    assert sorted(local_checkpoint_steps(root)) == [6]  # keep = 1, the others are up there
    manifest = store.read_manifest(layout.directory("checkpoint", 6))
    assert {f.path for f in manifest.files} == {p.name for p in checkpoint_dir(root, 6).iterdir()}

    # A fresh machine: nothing local. It downloads step 6, which loads into a new model.
    fresh = tmp_path / "fresh"
    assert restore_from_bucket(store, layout, fresh) == 6
    assert latest_checkpoint(fresh) == checkpoint_dir(fresh, 6)
    assert (fresh / "dispatcher.json").read_text() == '{"num_released": 14}'
    model, optimizer, scheduler = _parts(seed=1)
    state = load_checkpoint(
        checkpoint_dir(fresh, 6), model=model, optimizer=optimizer, scheduler=scheduler
    )
    assert (state.step, state.version, state.trained_ids) == (6, 6, ["t6"])
    _assert_same_weights(model, parts[0])
    saved_exp_avg = parts[1].state[next(iter(parts[0].parameters()))]["exp_avg"]
    assert torch.equal(optimizer.state[next(iter(model.parameters()))]["exp_avg"], saved_exp_avg)
    # The same machine again: its own newest is as new as the bucket's, nothing to fetch.
    assert restore_from_bucket(store, layout, fresh) is None


def test_a_corrupted_object_is_refused_and_leaves_no_local_checkpoint(s3_storage, tmp_path):
    storage = s3_storage()
    store, layout = ObjectStore(storage), storage.layout("r2")
    path = _train_and_save(tmp_path / "checkpoints", _parts(), 2)
    directory = layout.directory("checkpoint", 2)
    store.upload_artifact(path, directory, kind="checkpoint", step=2)
    data = (path / "__0_0.distcp").read_bytes()
    store.put_bytes(directory + "__0_0.distcp", bytes([data[0] ^ 1]) + data[1:])  # same size

    from common.s3 import StorageError

    fresh = tmp_path / "fresh"
    with pytest.raises(StorageError, match="SHA-256 mismatch"):
        restore_from_bucket(store, layout, fresh)
    assert latest_checkpoint(fresh) is None  # state.json comes last and never came


def test_an_upload_killed_midway_does_not_look_complete(s3_server, s3_storage, tmp_path):
    """SIGKILL while the largest file of step 4 is half sent (a multipart upload in flight):
    step 4 has objects in the bucket but is not complete; a fresh machine resumes from step
    2; the restarted learner's uploader sends step 4 again, and the bucket's prune sweeps
    nothing it should keep."""
    storage = s3_storage(run="killed", multipart_chunk_mib=5)
    store, layout = ObjectStore(storage), storage.layout("unused")
    root = tmp_path / "checkpoints"
    parts = _parts(width=1200)  # ~17 MB of optimizer state: a multipart upload
    step2 = _train_and_save(root, parts, 2)
    store.upload_artifact(step2, layout.directory("checkpoint", 2), kind="checkpoint", step=2)
    step4 = _train_and_save(root, parts, 4)

    victim = subprocess.Popen(
        [sys.executable, "-m", "tests.learner.s3_upload_victim", str(step4), "4"]
        + [s3_server.endpoint_url, storage.bucket],
        cwd=REPO,
        env={**s3_server.env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = victim.stdout.readline()
        assert line.startswith("PAUSED in __0_0.distcp"), line
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
    assert victim.returncode == -signal.SIGKILL

    listing = store.listing(layout.directory("checkpoint", 4))
    assert layout.directory("checkpoint", 4) + ".metadata" in listing  # it was under way
    assert store.artifacts(layout, "checkpoint") == ([2], [4])
    assert restore_from_bucket(store, layout, tmp_path / "fresh") == 2

    # The learner restarts on the machine that still has step 4: it goes up again.
    sync = open_artifacts(
        storage, run_name="unused", checkpoint_root=root, keep_local=1, resume=True
    )
    assert sync.close(timeout_s=120)
    assert store.artifacts(layout, "checkpoint") == ([2, 4], [])
    assert sorted(local_checkpoint_steps(root)) == [4]


def test_acks_wait_for_the_checkpoint_that_covers_them_to_be_in_the_bucket():
    from learner.artifacts import durable_acks

    held = [(2, ["a", "b"]), (4, ["c"]), (6, ["d"])]
    assert durable_acks(held, uploaded=set()) == []
    assert durable_acks(held, uploaded={2}) == [(2, ["a", "b"])]
    # Checkpoint 4 covers everything before it, even if 2 never made it up.
    assert durable_acks(held, uploaded={4}) == [(2, ["a", "b"]), (4, ["c"])]
    assert durable_acks(held, uploaded={6, 2}) == held
    assert durable_acks(held, uploaded=set(), everything=True) == held


def test_snapshots_newer_than_the_resumed_checkpoint_are_deleted_not_announced(
    s3_storage, tmp_path
):
    """A learner killed after snapshot 6 went up but before checkpoint 6 did resumes from
    checkpoint 4: snapshot 6 holds weights of a future this run trains again, differently.
    Announcing it would tell actors of a snapshot newer than the version (the wire refuses
    that, docs/contracts.md); it is deleted and snapshot 4 is the one announced."""
    storage = s3_storage(keep_snapshots=3)
    store, layout = ObjectStore(storage), storage.layout("r4")
    for version in (2, 4, 6):
        snapshot = tmp_path / f"snapshot_{version}"
        snapshot.mkdir()
        (snapshot / "model.safetensors").write_bytes(bytes([version]) * 64)
        store.upload_artifact(
            snapshot, layout.directory("snapshot", version), kind="snapshot", step=version
        )
    root = tmp_path / "checkpoints"
    _train_and_save(root, _parts(), 4)

    sync = open_artifacts(storage, run_name="r4", checkpoint_root=root, keep_local=1, resume=True)
    assert sync.announced_snapshot(None) == (layout.url(layout.directory("snapshot", 4)), 4)
    assert store.artifacts(layout, "snapshot")[0] == [2, 4]
    assert sync.close(timeout_s=120)
