"""A real broadcast into a CUDA vLLM engine (model runner as vLLM picks it on GPU), then
greedy output against transformers on the same weights, sampled-token logprobs against
transformers' recomputation (the logprob gap), and the in-flight update's stall.

    nccl: the sender (the learner's side) on GPU 1, the engine on GPU 0   (2+ GPUs)
    gloo: both on GPU 0, weights through host memory (the co-located mode, 1 GPU)

Both dtypes sides are `auto`: bf16 on GPU. bf16 greedy decoding may legitimately differ from
an fp32 reference where the reference itself has a near-tie, so a differing token is
accepted only where transformers' own logits put it within `NEAR_TIE` (conftest) of its
argmax; the exact agreement is recorded."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from tests.gpu.conftest import (
    greedy_against,
    need_gpus,
    record,
    sampled_logprob_gap,
    start_bf16_engine,
)
from weights.actor_side.subscription import WeightSubscription
from weights.config import WeightSyncConfig
from weights.learner_side.sender import WeightSender

pytestmark = [pytest.mark.gpu, pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
async def cuda_engine(tiny_model_dir):
    engine = await start_bf16_engine(tiny_model_dir, track_weights_checksum=True)
    yield engine
    engine.shutdown()


def _perturbed(tiny_model_dir, seed: int) -> torch.nn.Module:
    """The tiny model with noise added, its weights rounded to bf16 (what the engine gets),
    computing in fp32 on CPU: the reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
            param.copy_(param.to(torch.bfloat16).to(torch.float32))
    return model.eval()


async def _push(engine, model, backend: str, version: int):
    """Broadcast `model` as round `version` over `backend` and apply it in flight."""
    device = "cuda" if backend == "nccl" else "cpu"
    sender = WeightSender(
        WeightSyncConfig(store_port=0, backend=backend, join_timeout_s=30, transfer_timeout_s=60),
        dtype=engine.dtype,
    )
    subscription = WeightSubscription(
        "127.0.0.1", sender.config.store_port, slots=engine.num_weight_slots, dtype=engine.dtype
    )
    weights = [(n, p.detach().to(device, torch.bfloat16)) for n, p in model.named_parameters()]
    try:
        return await _round(engine, sender, subscription, weights, version)
    finally:
        subscription.leave()
        await engine.close_weight_channel()
        sender.close()


async def _round(engine, sender, subscription, weights, version: int):
    """Round `version` of `weights` from `sender` (in a thread), taken by `engine` in flight:
    (the sender's report, the engine's update)."""
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("r", sender.broadcast(version, weights))
    )
    thread.start()
    ticket = await asyncio.to_thread(subscription.wait_round, engine.version, 60.0)
    update = await engine.update_weights(ticket)
    await asyncio.to_thread(thread.join)
    return result["r"], update


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
async def test_broadcast_into_cuda_engine_matches_transformers(
    cuda_engine, tiny_model_dir, prompts, backend
):
    if backend == "nccl":
        need_gpus(2)
        torch.cuda.set_device(1)  # the sender's GPU; the engine's worker holds GPU 0
    model = _perturbed(tiny_model_dir, seed=11 if backend == "nccl" else 12)
    version = cuda_engine.version + 1
    report, update = await _push(cuda_engine, model, backend, version)
    assert report.ok and report.num_receivers == 1 and update.version == version
    exact, total = await greedy_against(cuda_engine, model, prompts, version)
    assert exact >= 0.5 * total  # wrong weights would agree on almost nothing
    gap = await sampled_logprob_gap(cuda_engine, model, prompts, seed=100)
    record(**{
        f"{backend}_broadcast_mb_per_s": round(report.mb_per_s, 1),
        f"{backend}_update_stall_ms": round(update.stall_s * 1e3, 1),
        f"{backend}_receive_ms": round(update.receive_s * 1e3, 1),
        f"{backend}_load_ms": round(update.load_s * 1e3, 1),
        f"{backend}_greedy_exact_fraction": round(exact / max(total, 1), 3),
        f"{backend}_logprob_gap_mean": float(gap.mean()),
        f"{backend}_logprob_gap_max": float(gap.max()),
    })  # fmt: skip
    assert float(gap.mean()) < 0.05  # bf16 against an fp32 reference: rounding, not a bug


async def test_delta_rounds_into_a_bf16_cuda_engine(cuda_engine, tiny_model_dir, prompts):
    """`weight_sync.delta` into the bf16 CUDA engine over gloo: a keyframe, then three
    versions as bf16 deltas rebuilt in the engine's worker (on the host) and loaded into its
    GPU; after each the engine loaded exactly the learner's bf16 version (its checksum),
    after the last it generates as transformers does on those weights."""
    from weights.shared.tensors import checksum

    sender = WeightSender(
        WeightSyncConfig(store_port=0, backend="gloo", delta=True, transfer_timeout_s=60),
        dtype=cuda_engine.dtype,
    )
    subscription = WeightSubscription(
        "127.0.0.1", sender.config.store_port, slots=cuda_engine.num_weight_slots,
        dtype=cuda_engine.dtype,
    )  # fmt: skip
    model, reports, updates = _perturbed(tiny_model_dir, seed=21), [], []
    generator = torch.Generator().manual_seed(22)
    try:
        for round_index in range(4):
            if round_index:  # an RL-sized step: most bf16 values stay as they were
                with torch.no_grad():
                    for param in model.parameters():
                        moved = param + 2e-5 * torch.randn(param.shape, generator=generator)
                        param.copy_(moved.to(torch.bfloat16).to(torch.float32))
            weights = [(n, p.detach().to(torch.bfloat16)) for n, p in model.named_parameters()]
            version = cuda_engine.version + 1
            report, update = await _round(cuda_engine, sender, subscription, weights, version)
            assert report.ok and update.version == version
            got, expected = await cuda_engine.weights_checksum(), checksum(weights)
            assert got["sum"] == pytest.approx(expected["sum"], rel=1e-12)
            assert got["sum_sq"] == pytest.approx(expected["sum_sq"], rel=1e-12)
            reports.append(report)
            updates.append(update)
    finally:
        subscription.leave()
        await cuda_engine.close_weight_channel()
        sender.close()
    assert [report.keyframe for report in reports] == [True, False, False, False]
    exact, total = await greedy_against(cuda_engine, model, prompts, cuda_engine.version)
    assert exact >= 0.5 * total
    record(**{
        "delta_bytes_over_raw": [round(r.num_bytes / r.raw_bytes, 4) for r in reports[1:]],
        "delta_update_stall_ms": [round(u.stall_s * 1e3, 1) for u in updates[1:]],
        "delta_keyframe_stall_ms": round(updates[0].stall_s * 1e3, 1),
        "delta_greedy_exact_fraction": round(exact / max(total, 1), 3),
    })  # fmt: skip
