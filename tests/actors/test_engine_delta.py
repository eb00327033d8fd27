"""Delta rounds into the real vLLM engine (`weight_sync.delta`, weights/shared/delta_book.py): a
keyframe, then versions sent as their change from the one before, rebuilt in the engine's
worker and loaded: after each the engine holds the learner's version bit for bit (the
checksum of what it loaded), and after the last it generates what transformers does on the
same weights."""

from __future__ import annotations

import copy

import pytest
import torch

from demo.reference import hf_greedy
from tests.actors.test_vllm_engine import _request, push_round
from weights.actor_side.subscription import WeightSubscription
from weights.config import WeightSyncConfig
from weights.learner_side.sender import WeightSender
from weights.shared.tensors import checksum

vllm = pytest.mark.vllm


def _moved(model, *, seed: int, fraction: float = 0.02, scale: float = 0.05):
    """A copy of `model` with `fraction` of every parameter's values moved (an RL step in
    bf16 leaves most values as they were; in the tests' fp32 engine, so do we)."""
    clone = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in clone.parameters():
            chosen = torch.rand(param.shape, generator=generator) < fraction
            param.add_(chosen * torch.randn(param.shape, generator=generator) * scale)
    return clone


@vllm
async def test_delta_rounds_reach_the_engine_bit_for_bit(
    vllm_engine, hf_tiny_model, prompts, tokenizer
):
    sender = WeightSender(
        WeightSyncConfig(store_port=0, backend="gloo", delta=True, keyframe_interval=10)
    )
    subscription = WeightSubscription(sender.config.store_host, sender.config.store_port)
    model, reports = hf_tiny_model, []
    try:
        for round_index in range(4):
            model = _moved(model, seed=10 + round_index)
            weights = [(name, param.detach()) for name, param in model.named_parameters()]
            version = vllm_engine.version + 1
            report, update, _ = await push_round(
                vllm_engine, sender, subscription, weights, version
            )
            assert report.ok and update.version == version
            expected = checksum(model.named_parameters())
            got = await vllm_engine.weights_checksum()
            assert got["num_tensors"] == expected["num_tensors"]
            # Each tensor's CRC is checked where it is rebuilt; the sums see it was loaded.
            assert got["sum"] == pytest.approx(expected["sum"], rel=1e-12)
            assert got["sum_sq"] == pytest.approx(expected["sum_sq"], rel=1e-12)
            reports.append(report)
    finally:
        subscription.leave()
        sender.close()
    assert [report.keyframe for report in reports] == [True, False, False, False]
    assert all(r.num_bytes < 0.3 * r.raw_bytes for r in reports[1:])
    for prompt in prompts:
        generation = await vllm_engine.generate(prompt, _request(temperature=0.0, max_tokens=16))
        assert generation.token_ids == hf_greedy(model, prompt, 16, tokenizer.eos_token_id)
    ratios = ", ".join(f"{r.num_bytes / r.raw_bytes:.3f}" for r in reports)
    print(f"\ndelta rounds into the engine, bytes over raw: {ratios}")
