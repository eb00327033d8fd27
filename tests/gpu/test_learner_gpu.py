"""The learner on GPUs: NCCL ranks, each on the GPU of its LOCAL_RANK (not all on GPU 0),
loading the model sharded (meta device + rank-0 broadcast) equal to the checkpoint. One rank
runs on a 1-GPU machine (the same path: the NCCL group, `device_id`, the meta-device build),
two need two GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from common.procs import free_port
from tests.gpu.conftest import REPO, need_gpus

pytestmark = [pytest.mark.gpu]
WORKER = REPO / "tests" / "learner" / "sharded_load_worker.py"


@pytest.mark.parametrize("world", [1, 2])
def test_ranks_on_their_own_gpus_load_the_model_sharded(tiny_model_dir, tmp_path, world):
    need_gpus(world)
    from transformers import AutoModelForCausalLM

    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(world),
        "PYTHONPATH": str(REPO),
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(world))),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(tiny_model_dir), str(tmp_path), "cuda"],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    logs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), "\n".join(logs)
    counts = json.loads((tmp_path / "counts.json").read_text())
    assert [device for _, device in counts] == [f"cuda:{r}" for r in range(world)]
    got = torch.load(tmp_path / "sharded.pt")
    whole = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for name, param in whole.named_parameters():
        assert torch.equal(got["params"][name], param.detach()), name
