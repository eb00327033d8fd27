"""One rank of the 2-rank LoRA test (test_lora_distributed.py): load MODEL_DIR sharded with
an adapter (meta model, rank 0's state broadcast), train two steps on shared-prefix groups,
save a checkpoint after the first and resume it in a freshly loaded model. Rank 0 writes the
initial full state, the adapter after each step (through the weight-broadcast iterator) and
the metrics to OUT.

    python lora_fsdp_worker.py MODEL_DIR OUT CONFIG_JSON"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from learner.trainer.checkpoint import TrainingState
from learner.trainer.config import TrainerConfig
from learner.trainer.model_init import load_model
from learner.trainer.trainer import Trainer
from tests.learner.segment_builders import group
from tests.learner.two_ranks import exit_after_teardown
from weights.learner_side.fsdp import full_parameters

BATCHES = [
    {"group_id": "a", "prefix_len": 24, "suffix_lens": [9, 1, 17, 4, 30], "seed": 1},
    {"group_id": "b", "prefix_len": 20, "suffix_lens": [12, 6, 25], "seed": 2},
]


def batch(step: int):
    return group(**BATCHES[step])


def main() -> None:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    config = TrainerConfig.model_validate_json(sys.argv[3])
    dist.init_process_group("gloo")
    rank, cpu = dist.get_rank(), torch.device("cpu")
    model = load_model(model_dir, device=cpu, finetune=config.finetune)
    initial = {name: t.clone() for name, t in full_parameters(model)}
    trainer = Trainer(model, config, device=cpu)
    results = {"metrics_1": trainer.train_step(batch(0))}
    adapter_1 = dict(trainer.full_weights())
    trainer.save(out / "checkpoints", TrainingState())
    results["metrics_2"] = trainer.train_step(batch(1))
    adapter_2 = dict(trainer.full_weights())

    resumed = Trainer(load_model(model_dir, device=cpu, finetune=config.finetune), config)
    resumed.load(out / "checkpoints" / "step_00000001")
    results["metrics_2_resumed"] = resumed.train_step(batch(1))
    adapter_2_resumed = dict(resumed.full_weights())
    if rank == 0:
        saved = {"initial": initial, "1": adapter_1, "2": adapter_2, "2_resumed": adapter_2_resumed}
        torch.save(saved, out / "weights.pt")
        (out / "results.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_after_teardown()
