"""One rank of the sharded-load test (test_model_init.py): load MODEL_DIR sharded over 2 gloo
ranks, then rank 0 writes the gathered full weights, the rotary buffers and each rank's
local parameter count to OUT."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from learner.model_init import load_model
from weights.fsdp import full_parameters


def main() -> None:
    model_dir, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = load_model(model_dir, device=torch.device("cpu"))
    local = sum(p.to_local().numel() for p in model.parameters())
    counts = [None, None]
    dist.all_gather_object(counts, local)
    full = {name: tensor.clone() for name, tensor in full_parameters(model)}
    if rank == 0:
        buffers = {name: b.clone() for name, b in model.named_buffers()}
        torch.save({"params": full, "buffers": buffers}, out / "sharded.pt")
        (out / "counts.json").write_text(json.dumps(counts))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
