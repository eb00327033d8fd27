"""LoRA under FSDP2 (2 gloo ranks, loopback): the model loads sharded with its adapter (rank
0's initial adapter reaches every rank), two shared-prefix steps move the adapter as one
process does from the same start, and a 2-rank LoRA checkpoint resumes bit-identically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from learner.trainer.lora import add_lora
from learner.trainer.trainer import Trainer
from tests.learner.builders import learner_config, tiny_qwen2
from tests.learner.lora_fsdp_worker import batch
from tests.learner.two_ranks import run_two_ranks

WORKER = Path(__file__).with_name("lora_fsdp_worker.py")
CONFIG = learner_config(
    micro_batch_tokens=60,  # group a does not fit: split across micro-batches and ranks
    optim={"eps": 1e-4, "lr": 1e-2},
    algorithm={"entropy_coef": 0.01, "loss_reduction": "seq_mean_token_mean"},
    finetune={"mode": "lora", "rank": 4, "alpha": 8},
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("base")
    tiny_qwen2(seed=0, tie_word_embeddings=True).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, model_dir):
    out = tmp_path_factory.mktemp("lora_fsdp")
    run_two_ranks([str(WORKER), str(model_dir), str(out), CONFIG.model_dump_json()])
    return json.loads((out / "results.json").read_text()), torch.load(out / "weights.pt")


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


def test_the_sharded_load_carries_the_base_and_rank_zeros_adapter(two_ranks, model_dir):
    _, weights = two_ranks
    initial = weights["initial"]
    base = dict(tiny_qwen2(seed=0, tie_word_embeddings=True).named_parameters())
    for name, tensor in base.items():
        loaded = initial.get(name) if name in initial else initial[_based(name)]
        assert torch.equal(loaded, tensor.detach()), name
    a = [t for n, t in initial.items() if ".lora_A." in n]
    b = [t for n, t in initial.items() if ".lora_B." in n]
    assert len(a) == len(b) == 2 * 7 and all(t.abs().max() > 0 for t in a)
    assert all(not t.any() for t in b)  # PEFT starts B at zero: the adapted model is the base


def _based(name: str) -> str:
    module, _, leaf = name.rpartition(".")
    return f"{module}.base_layer.{leaf}"


def test_two_ranks_move_the_adapter_like_one_process(two_ranks, model_dir):
    results, weights = two_ranks
    model = add_lora(tiny_qwen2(seed=0, tie_word_embeddings=True), CONFIG.finetune)
    missing, unexpected = model.load_state_dict(weights["initial"], strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied to the embedding
    one = Trainer(model, CONFIG)
    for step in (1, 2):
        metrics = one.train_step(batch(step - 1))
        adapter = dict(one.full_weights())
        assert adapter.keys() == weights[str(step)].keys()
        assert _max_diff(weights[str(step)], adapter) < 1e-6
        got = results[f"metrics_{step}"]
        assert got["loss"] == pytest.approx(metrics["loss"], rel=1e-4, abs=1e-7)
        assert got["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-4)
    moved = {n: t for n, t in weights["2"].items()}
    assert _max_diff(moved, {n: torch.zeros_like(t) for n, t in moved.items()}) > 1e-3


def test_a_two_rank_lora_checkpoint_resumes_bit_identically(two_ranks):
    results, weights = two_ranks
    assert results["metrics_2_resumed"]["loss"] == results["metrics_2"]["loss"]
    assert _max_diff(weights["2_resumed"], weights["2"]) == 0.0
