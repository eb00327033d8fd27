"""The learner's half of the weights log (`learner.snapshot_deltas`, learner/trainer/ranks.py):
a snapshot at start as the first keyframe, a delta per version between snapshots, older
deltas gone with each snapshot, and a resume that drops the abandoned future's deltas and
continues the chain from the checkpoint's version. One process, the real Trainer."""

from __future__ import annotations

import torch

from learner.trainer.checkpoint import TrainingState
from learner.trainer.ranks import RankCommands
from learner.trainer.trainer import Trainer
from tests.learner.builders import learner_config, random_samples, tiny_qwen2
from weights.formats.delta_log import DeltaFile, delta_version, replay
from weights.formats.snapshot import safetensors_weights


def _commands(tmp_path, *, seed: int = 0) -> RankCommands:
    return RankCommands(
        Trainer(tiny_qwen2(seed=seed), learner_config()),
        checkpoint_dir=str(tmp_path / "checkpoints"),
        keep=5,
        snapshot_dir=tmp_path / "weights",
        snapshot_interval=3,
        snapshot_deltas=True,
    )


def _step(commands: RankCommands) -> dict:
    commands.train(random_samples(num_samples=4, seed=commands.version))
    return commands.publish_weights(commands.version)


def _deltas(tmp_path) -> list[int]:
    return sorted(delta_version(p.name) for p in (tmp_path / "weights" / "deltas").glob("*"))


def _current(commands: RankCommands) -> dict[str, torch.Tensor]:
    return dict(commands.trainer.full_weights(dtype=commands.trainer.weights_dtype))


def test_a_delta_per_version_between_snapshots(tmp_path):
    commands = _commands(tmp_path)
    commands.start_weights_log()
    assert commands.snapshot[1] == 0 and _deltas(tmp_path) == []
    reports = [_step(commands) for _ in range(5)]
    assert commands.snapshot[1] == 3 and _deltas(tmp_path) == [4, 5]
    assert all(r["log_bytes"] > 0 for r in reports)  # v3's too, replaced by its snapshot
    assert commands.deltas_path == str((tmp_path / "weights" / "deltas").resolve())
    # Snapshot v3 + deltas 4 and 5 = the learner's v5, bit for bit.
    files = [DeltaFile(tmp_path / "weights" / "deltas" / f"v00000{v}.delta") for v in (4, 5)]
    rebuilt = {n: t for n, t, _ in replay(safetensors_weights(commands.snapshot[0]), None, files)}
    assert all(torch.equal(rebuilt[n], t) for n, t in _current(commands).items())
    commands.stop()


def test_a_resume_drops_the_abandoned_deltas_and_continues_from_the_checkpoint(tmp_path):
    commands = _commands(tmp_path)
    commands.start_weights_log()
    _step(commands)
    checkpoint = commands.save(TrainingState()).result()  # at v1
    for _ in range(4):
        _step(commands)  # v2..v5: snapshot v3, deltas 4, 5 (a future about to be lost)
    commands.stop()

    resumed = _commands(tmp_path, seed=1)
    resumed.load(checkpoint)
    resumed.start_weights_log()
    assert resumed.version == 1 and resumed.snapshot[1] == 1 and _deltas(tmp_path) == []
    _step(resumed)  # v2 again, differently: a delta against the checkpoint's v1
    assert _deltas(tmp_path) == [2]
    delta = DeltaFile(tmp_path / "weights" / "deltas" / "v000002.delta")
    assert delta.header.base == 1
    rebuilt = {n: t for n, t, _ in replay(safetensors_weights(resumed.snapshot[0]), None, [delta])}
    assert all(torch.equal(rebuilt[n], t) for n, t in _current(resumed).items())
    resumed.stop()
