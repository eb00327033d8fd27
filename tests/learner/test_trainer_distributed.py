"""Acceptance: a 2-rank FSDP2 step (gloo, loopback) updates the weights exactly like a
single process on the same batch; a 2-rank checkpoint resumes bit-identically.

The ranks are two `fsdp_worker.py` subprocesses (torchrun's environment variables set by
hand); the single-process reference runs here, unsharded. The config switches on the
features whose distributed handling could go wrong: a proximal recompute (TIS), a sharded
reference model (KL), the entropy bonus, dual clip, per-sequence reduction, gradient
checkpointing, weight decay, warmup, and a batch whose plan gives rank 1 an empty
micro-batch.
"""

import json
from pathlib import Path

import pytest
import torch

from learner.trainer.prefix_plan import plan_pieces
from learner.trainer.trainer import Trainer
from tests.learner.builders import learner_config, random_samples, tiny_qwen2
from tests.learner.fsdp_worker import BATCH_1, BATCH_2
from tests.learner.two_ranks import run_two_ranks

WORKER = Path(__file__).with_name("fsdp_worker.py")
CONFIG = learner_config(
    micro_batch_tokens=74,
    gradient_checkpointing=True,
    optim={"warmup_steps": 2, "eps": 1e-4},  # eps: see LINEAR_ADAM in test_trainer.py
    algorithm={
        "ratio_anchor": "proximal",
        "importance_weight": "tis",
        "kl_coef": 0.05,
        "entropy_coef": 0.01,
        "clip_ratio_c": 3.0,
        "loss_reduction": "seq_mean_token_mean",
    },
)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    run_two_ranks([str(WORKER), str(out), CONFIG.model_dump_json()])
    return json.loads((out / "results.json").read_text()), torch.load(out / "weights.pt")


@pytest.fixture(scope="module")
def one_process():
    trainer = Trainer(tiny_qwen2(seed=0), CONFIG)
    results = {"metrics_1": trainer.train_step(random_samples(**BATCH_1))}
    weights = {"1": {n: p.detach().clone() for n, p in trainer.model.named_parameters()}}
    results["metrics_2"] = trainer.train_step(random_samples(**BATCH_2))
    weights["2"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    weights["0"] = dict(tiny_qwen2(seed=0).named_parameters())
    return results, weights


def _max_diff(a, b) -> float:
    assert a.keys() == b.keys()
    return max((a[n].detach() - b[n].detach()).abs().max().item() for n in a)


def test_batch_one_leaves_rank_one_an_empty_micro_batch():
    plan = plan_pieces(random_samples(**BATCH_1), num_ranks=2, token_budget=74)
    assert plan[1][-1] == []


def test_two_ranks_update_the_weights_like_one_process(two_ranks, one_process):
    (dist_results, dist_weights), (ref_results, ref_weights) = two_ranks, one_process
    for step in ("1", "2"):
        assert _max_diff(ref_weights[step], ref_weights["0"]) > 1e-4  # the step did move them
        assert _max_diff(dist_weights[step], ref_weights[step]) < 1e-6
        ref, got = ref_results[f"metrics_{step}"], dist_results[f"metrics_{step}"]
        for key in (
            "loss",
            "grad_norm",
            "ratio_mean",
            "ratio_std",
            "entropy",
            "kl_ref",
            "mismatch_kl",
        ):
            assert got[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-7), key
        assert got["num_loss_tokens"] == ref["num_loss_tokens"]
        assert got["version"] == ref["version"] == int(step)


def test_two_rank_checkpoint_resumes_bit_identically(two_ranks):
    results, weights = two_ranks
    assert results["resumed_state"] == {"step": 1, "version": 1, "trained_ids": ["t0", "t1"]}
    assert results["metrics_2_resumed"]["loss"] == results["metrics_2"]["loss"]
    assert _max_diff(weights["2_resumed"], weights["2"]) == 0.0


def test_rank0_receives_full_weights(two_ranks):
    results, weights = two_ranks
    assert results["num_tensors"] == len(list(tiny_qwen2().parameters()))
    assert set(weights["1"]) == set(dict(tiny_qwen2().named_parameters()))
    embed = weights["1"]["model.embed_tokens.weight"]
    assert tuple(embed.shape) == (300, 64)  # full, not a shard
