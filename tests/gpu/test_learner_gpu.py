"""The learner on GPUs: two NCCL ranks, each on the GPU of its LOCAL_RANK (not both on GPU
0), loading the model sharded (meta device + rank-0 broadcast) equal to the checkpoint."""

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


def test_two_ranks_on_two_gpus_load_the_model_sharded(tiny_model_dir, tmp_path):
    need_gpus(2)
    from transformers import AutoModelForCausalLM

    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "PYTHONPATH": str(REPO),
        "CUDA_VISIBLE_DEVICES": "0,1",
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
        for rank in (0, 1)
    ]
    logs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), "\n".join(logs)
    counts = json.loads((tmp_path / "counts.json").read_text())
    assert [device for _, device in counts] == ["cuda:0", "cuda:1"]
    got = torch.load(tmp_path / "sharded.pt")
    whole = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for name, param in whole.named_parameters():
        assert torch.equal(got["params"][name], param.detach()), name
