"""One rank of the sharded-load test (test_model_init.py; tests/gpu/test_learner_gpu.py with
`cuda`): load MODEL_DIR sharded over WORLD_SIZE ranks (gloo on CPU; NCCL with each rank on the GPU
of its LOCAL_RANK, set before anything touches CUDA, as learner/main.py does), then rank 0
writes the gathered full weights, the rotary buffers and each rank's local parameter count
and device to OUT.

    python sharded_load_worker.py MODEL_DIR OUT [cpu|cuda]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from learner.trainer.model_init import default_device, load_model
from tests.learner.two_ranks import exit_after_teardown
from weights.learner_side.fsdp import full_parameters


def main() -> None:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    on_gpu = sys.argv[3:] == ["cuda"]
    device = default_device() if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = load_model(model_dir, device=device)
    # One rank loads whole (learner/trainer/model_init.py): plain parameters, no DTensor shards.
    local = sum(getattr(p, "to_local", lambda p=p: p)().numel() for p in model.parameters())
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, (local, str(next(model.parameters()).device)))
    full = {name: tensor.cpu().clone() for name, tensor in full_parameters(model)}
    if rank == 0:
        buffers = {name: b.cpu().clone() for name, b in model.named_buffers()}
        torch.save({"params": full, "buffers": buffers}, out / "sharded.pt")
        (out / "counts.json").write_text(json.dumps(counts))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_after_teardown()
