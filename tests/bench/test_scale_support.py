"""What bench/scale.py divides by and sums up, checked without a run: the probes of the
machine's bandwidth, the roles told apart by their command lines, a checkpoint's and a
resume's timing (the ladder's parameter counts: tests/demo/test_random_model.py; the
rendered table: test_render_docs.py)."""

from __future__ import annotations

import torch

from bench.common import loopback_bytes_per_s
from bench.scale import CheckpointTimes
from bench.scale_support import disk_bytes_per_s, evict, resume_seconds, role_of
from learner.trainer.checkpoint import STATE_FILE, TrainingState
from learner.trainer.trainer import Trainer
from tests.learner.builders import learner_config, random_samples, tiny_qwen2


def test_the_bandwidth_probes_move_every_byte(tmp_path):
    assert loopback_bytes_per_s(8 * 2**20) > 0
    disk = disk_bytes_per_s(tmp_path, 4 * 2**20)
    assert disk["write"] > 0 and disk["read"] > 0
    assert list(tmp_path.iterdir()) == []


def test_roles_are_told_apart_by_the_module_they_run():
    python = "/repo/.venv/bin/python -m"
    assert role_of(f"{python} learner.cli --config c.toml") == "learner"
    assert role_of(f"{python} actors.cli --config c.toml --replicas 1") == "actor"
    assert role_of(f"{python} envservers.cli --config c.toml") == "envserver"
    assert role_of("/bin/nats-server -p 4222") is None


def test_a_checkpoint_is_timed_from_its_directory_to_its_state_file(tmp_path):
    times = CheckpointTimes()
    step = tmp_path / "checkpoints" / "step_00000001"
    times.poll(tmp_path, 0.0)  # nothing yet
    step.mkdir(parents=True)
    times.poll(tmp_path, 1.0)
    (step / STATE_FILE).write_text("{}")
    times.poll(tmp_path, 3.5)
    times.poll(tmp_path, 9.0)  # seen again: not re-timed
    assert times.seconds() == [2.5]


def test_the_stall_per_update_is_read_from_the_actors_histogram():
    # The series carry the update's kind: unlabelled names matched nothing (a column of NaN).
    import prometheus_client

    from bench.scale import _per_update_stall_s
    from bench.tether_run import parse_counters

    registry = prometheus_client.CollectorRegistry()
    stall = prometheus_client.Histogram(
        "tether_actor_weight_update_stall_seconds", "stall", ["kind"], registry=registry
    )
    for seconds in (0.5, 1.5):
        stall.labels("broadcast").observe(seconds)
    stall.labels("snapshot").observe(30.0)  # a snapshot load is not a broadcast round
    page = prometheus_client.generate_latest(registry).decode()
    assert _per_update_stall_s([parse_counters(page)]) == 1.0


def test_a_resume_is_timed_on_the_learners_own_restore(tmp_path):
    """The ladder's resume: a fresh trainer of the run's config restores a checkpoint its
    learner wrote (a mismatch would raise), read from the disk (its pages evicted)."""
    model = tiny_qwen2()
    model.save_pretrained(tmp_path / "model")
    config = learner_config(model_path=str(tmp_path / "model"))
    trainer = Trainer(model, config, device=torch.device("cpu"))
    trainer.train_step(random_samples(num_samples=4))
    checkpoint = trainer.save(tmp_path / "checkpoints", TrainingState())
    evict(checkpoint)  # no error on a directory of files
    assert resume_seconds(config.model_dump_json(), checkpoint) > 0
