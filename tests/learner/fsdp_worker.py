"""One rank of the FSDP2 acceptance run (launched twice by test_trainer_distributed.py).

Usage: RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python fsdp_worker.py OUT CONFIG_JSON

Trains two steps on fixed batches, saving a checkpoint after the first; then builds a fresh
trainer, loads the checkpoint and trains the second step again. Rank 0 writes the full
weights after each of these (gathered through the weight-broadcast iterator) and the
metrics to OUT.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from learner.trainer.checkpoint import TrainingState
from learner.trainer.config import TrainerConfig
from learner.trainer.trainer import Trainer
from tests.learner.builders import random_samples, tiny_qwen2
from tests.learner.two_ranks import exit_after_teardown

BATCH_1 = {"lengths": [62, 62, 62, 12], "seed": 1}
BATCH_2 = {"lengths": [30, 41, 55, 20, 9, 70], "seed": 2, "version": 0}


def gather(trainer: Trainer) -> tuple[dict[str, torch.Tensor], int]:
    """Full weights on rank 0 (nothing elsewhere) and how many tensors the gather yielded."""
    weights = {name: tensor.clone() for name, tensor in trainer.full_weights()}
    return weights, len(weights)


def main() -> None:
    out, config = Path(sys.argv[1]), TrainerConfig.model_validate_json(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {}

    trainer = Trainer(tiny_qwen2(seed=0), config, ref_model=tiny_qwen2(seed=0))
    results["metrics_1"] = trainer.train_step(random_samples(**BATCH_1))
    weights_1, results["num_tensors"] = gather(trainer)
    trainer.save(out / "checkpoints", TrainingState(trained_ids=["t0", "t1"]))
    results["metrics_2"] = trainer.train_step(random_samples(**BATCH_2))
    weights_2, _ = gather(trainer)

    # Fresh weights that differ from the checkpoint; the reference model stays the initial one.
    resumed = Trainer(tiny_qwen2(seed=7), config, ref_model=tiny_qwen2(seed=0))
    state = resumed.load(out / "checkpoints" / "step_00000001")
    results["resumed_state"] = {
        "step": state.step,
        "version": state.version,
        "trained_ids": state.trained_ids,
    }
    results["metrics_2_resumed"] = resumed.train_step(random_samples(**BATCH_2))
    weights_2_resumed, _ = gather(resumed)

    if rank == 0:
        torch.save(
            {"1": weights_1, "2": weights_2, "2_resumed": weights_2_resumed}, out / "weights.pt"
        )
        (out / "results.json").write_text(json.dumps(results))
    else:
        assert not weights_1, "only rank 0 receives full weights"
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_after_teardown()
