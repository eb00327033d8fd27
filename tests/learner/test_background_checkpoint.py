"""A checkpoint is written beside the loop (learner/trainer/ranks.py, learner/checkpoints.py):
`RankCommands.save` returns at once, and every later command waits for the write, so the
checkpoint holds exactly the weights it was started on however soon the next step comes. One
process, the real Trainer and DCP."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from learner.trainer.checkpoint import TrainingState
from learner.trainer.ranks import RankCommands
from learner.trainer.trainer import Trainer
from tests.learner.builders import learner_config, random_samples, tiny_qwen2


def _commands(tmp_path, trainer: Trainer) -> RankCommands:
    return RankCommands(
        trainer,
        checkpoint_dir=str(tmp_path / "checkpoints"),
        keep=5,
        snapshot_dir=tmp_path / "weights",
        snapshot_interval=1000,
    )


def _slow_saves(monkeypatch, trainer: Trainer, hold: threading.Event) -> list[float]:
    """Each save waits for `hold` before writing; returns when each write began."""
    began: list[float] = []
    real_save = trainer.save

    def save(root, state):
        hold.wait(timeout=30)
        began.append(time.monotonic())
        return real_save(root, state)

    monkeypatch.setattr(trainer, "save", save)
    return began


def test_the_next_step_waits_for_the_checkpoint_and_it_holds_the_weights_it_began_on(
    tmp_path, monkeypatch
):
    trainer = Trainer(tiny_qwen2(), learner_config())
    trainer.train_step(random_samples(num_samples=4, seed=1))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    hold = threading.Event()
    began = _slow_saves(monkeypatch, trainer, hold)
    commands = _commands(tmp_path, trainer)

    written = commands.save(TrainingState(trained_ids=["a"]))
    assert not written.done()  # returned while the write is held
    stepped = threading.Thread(target=commands.train, args=(random_samples(num_samples=4, seed=2),))
    stepped.start()
    time.sleep(0.3)
    assert trainer.version == 1  # the step is waiting for the checkpoint
    hold.set()
    stepped.join(timeout=60)
    assert trainer.version == 2 and written.done() and began

    resumed = Trainer(tiny_qwen2(seed=7), learner_config())
    state = resumed.load(written.result())
    assert (state.version, state.trained_ids) == (1, ["a"])
    for name, param in resumed.model.named_parameters():
        assert torch.equal(param, before[name]), name
    commands.stop()


def test_a_failed_checkpoint_is_raised_by_the_next_command(tmp_path, monkeypatch):
    trainer = Trainer(tiny_qwen2(), learner_config())

    def fail(root, state):
        raise OSError("disk full")

    monkeypatch.setattr(trainer, "save", fail)
    commands = _commands(tmp_path, trainer)
    commands.save(TrainingState())
    with pytest.raises(OSError, match="disk full"):
        commands.train(random_samples(num_samples=2))
    assert trainer.version == 0
