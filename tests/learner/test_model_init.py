"""Learner model building (learner/trainer/model_init.py): the device each rank takes, and a model
loaded sharded over two real gloo ranks equal to the same checkpoint loaded whole, with each
rank holding half the parameters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.procs import free_port
from learner.trainer import model_init
from learner.trainer.model_init import compute_dtype, select_device

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("sharded_load_worker.py")


def test_each_rank_takes_the_gpu_of_its_local_rank():
    assert select_device(0, 0) == torch.device("cpu")
    assert select_device(3, 0) == torch.device("cpu")  # CPU run: every rank on CPU
    assert select_device(0, 8) == torch.device("cuda", 0)
    assert select_device(7, 8) == torch.device("cuda", 7)
    with pytest.raises(ValueError, match="LOCAL_RANK=2 has no GPU of its own: 2 visible"):
        select_device(2, 2)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_without_native_bf16_is_said_once(native, monkeypatch, caplog):
    monkeypatch.setattr(model_init, "native_cpu_bf16", lambda: native)
    model_init._say_bf16_is_emulated.cache_clear()
    cpu = torch.device("cpu")
    assert compute_dtype("bf16", cpu) == compute_dtype("bfloat16", cpu) == torch.bfloat16
    assert compute_dtype("auto", cpu) == torch.float32
    said = [r for r in caplog.records if "without native bf16" in r.getMessage()]
    assert len(said) == (0 if native else 1)  # a warning per process, not per call
    model_init._say_bf16_is_emulated.cache_clear()


def test_sharded_load_over_two_ranks_equals_the_checkpoint(tmp_path):
    from transformers import AutoModelForCausalLM

    from demo.tinymodel import build_random_tiny_model

    model_dir = build_random_tiny_model()  # tied embeddings, rotary buffers
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(model_dir), str(tmp_path)],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    logs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), "\n".join(logs)
    got = torch.load(tmp_path / "sharded.pt")
    whole = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    expected = dict(whole.named_parameters())
    assert list(got["params"]) == list(expected)
    for name, tensor in got["params"].items():
        assert torch.equal(tensor, expected[name].detach()), name
    for name, buffer in whole.named_buffers():
        assert torch.equal(got["buffers"][name], buffer), name  # rebuilt, not garbage
    counts = [count for count, _ in json.loads((tmp_path / "counts.json").read_text())]
    total = sum(p.numel() for p in whole.parameters())
    # Each rank holds about half (FSDP2 shards dim 0; uneven rows round up on rank 0).
    assert sum(counts) == total and max(counts) < 0.55 * total
