"""The learner on one GPU without vLLM: what a 1-GPU machine can check even where the vLLM
CUDA wheel is not installed (the vLLM tests in this folder need it, the NCCL broadcast tests
two GPUs).

- the trainer on cuda:0 in bf16 (`dtype = auto`): autocast steps that learn, its logprobs
  against an fp32 recomputation on the same GPU (the numerical part of the logprob gap);
- its weights streamed in bf16 over gloo into a receiver process on the same machine (the
  co-located mode `make run` uses on a 1-GPU machine), bit-equal to what the learner holds;
- segment attention's one-call varlen kernel (learner/trainer/segment_varlen.py) equal to the
  per-segment path, outputs and gradients;
- figures only, never asserted: step time at 1,024- vs 8,192-token micro-batches with either
  attention kernel and the co-located broadcast's bytes/s, on a ~0.2B random Qwen2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from learner.trainer.model_init import load_model
from learner.trainer.trainer import Trainer
from tests.gpu.conftest import REPO, need_gpus, record
from tests.learner.builders import learner_config, random_samples
from weights.config import WeightSyncConfig
from weights.learner_side.sender import WeightSender
from weights.shared.tensors import checksum

pytestmark = [pytest.mark.gpu]
RECEIVER = REPO / "tests" / "weights" / "receiver_process.py"
CUDA = torch.device("cuda", 0)


def _trainer(model: torch.nn.Module, **overrides) -> Trainer:
    return Trainer(model, learner_config(**overrides), device=CUDA)


def _mid_size_qwen2() -> torch.nn.Module:
    """A random Qwen2 of ~0.2B parameters: big enough that a step is not kernel-launch
    bound, small enough for any GPU."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=32_000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=12,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def test_the_learner_trains_on_one_gpu_in_bf16(tiny_model_dir):
    need_gpus(1)
    trainer = _trainer(load_model(tiny_model_dir, device=CUDA), micro_batch_tokens=2048)
    reference = _trainer(
        load_model(tiny_model_dir, device=CUDA), micro_batch_tokens=2048, dtype="fp32"
    )
    assert trainer.bf16 and not reference.bf16  # auto is bf16 on GPU
    assert all(p.device == CUDA for p in trainer.model.parameters())

    samples = random_samples(num_samples=32, seed=3, min_len=20, max_len=160)
    micro_batches, _ = trainer.micro_batches(samples)
    bf16 = torch.cat(trainer.compute_logprobs(micro_batches)).float()
    fp32 = torch.cat(reference.compute_logprobs(micro_batches))
    gap = (bf16 - fp32).abs()
    record(
        learner_bf16_vs_fp32_logprob_gap_mean=round(gap.mean().item(), 5),
        learner_bf16_vs_fp32_logprob_gap_max=round(gap.max().item(), 5),
    )
    # bf16 keeps 8 bits of mantissa: a logprob near -6 is off by a few 1e-2 at the most.
    assert gap.mean().item() < 0.05, gap.mean().item()

    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    fp32_first = reference.train_step(samples)
    steps = [trainer.train_step(samples) for _ in range(5)]
    assert all(s["skipped"] == 0.0 for s in steps)
    assert steps[0]["loss"] == pytest.approx(fp32_first["loss"], abs=2e-2)
    assert steps[0]["grad_norm"] == pytest.approx(fp32_first["grad_norm"], rel=0.1)
    # Master weights stay fp32 and move; the same batch's policy loss goes down.
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    moved = max((p - before[n]).abs().max().item() for n, p in trainer.model.named_parameters())
    assert moved > 0
    assert steps[-1]["loss"] < steps[0]["loss"]


def _round_to_a_receiver(trainer: Trainer):
    """One weight round of the trainer's bf16 weights over gloo to a receiver process (as
    an engine's worker follows rounds): (the sender's report, the receiver's JSON line)."""
    config = WeightSyncConfig(
        store_port=0, backend="gloo", join_timeout_s=30.0, transfer_timeout_s=120.0
    )
    sender = WeightSender(config, dtype="bfloat16")
    store = f"{sender.config.store_host}:{sender.config.store_port}"
    receiver = subprocess.Popen(
        [sys.executable, str(RECEIVER), store, "1"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    try:
        assert receiver.stdout.readline().strip() == "ready"
        report = sender.broadcast(1, trainer.full_weights(dtype=torch.bfloat16))
        out, _ = receiver.communicate(timeout=300)
    finally:
        receiver.kill()
        sender.close()
    assert report.ok and report.num_receivers == 1, report
    return report, json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("size", ["tiny", "mid"])
def test_a_gpu_learners_weights_reach_a_receiver_over_gloo(tiny_model_dir, size):
    need_gpus(1)
    model = load_model(tiny_model_dir, device=CUDA) if size == "tiny" else _mid_size_qwen2()
    trainer = _trainer(model)
    if size == "tiny":
        trainer.train_step(random_samples(num_samples=8, seed=5))  # weights no checkpoint has
    expected = checksum(trainer.full_weights(dtype=torch.bfloat16))
    report, got = _round_to_a_receiver(trainer)
    assert got["version"] == 1
    assert got["checksum"] == expected
    record(**{
        f"colocated_gloo_{size}_broadcast_mb": round(report.num_bytes / 1e6, 1),
        f"colocated_gloo_{size}_broadcast_mb_per_s": round(report.mb_per_s, 1),
    })  # fmt: skip


def test_a_lora_learner_on_one_gpu_trains_and_sends_only_the_adapter(tiny_model_dir):
    """LoRA (docs/lora.md) on GPU: bf16 steps move the adapter alone, and the weight round
    carries the adapter (PEFT names), bit-equal at the receiver."""
    need_gpus(1)
    finetune = {"mode": "lora", "rank": 16, "alpha": 32}
    trainer = _trainer(load_model(tiny_model_dir, device=CUDA), finetune=finetune)
    assert trainer.lora and trainer.bf16
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    samples = random_samples(num_samples=16, seed=7, min_len=20, max_len=120)
    steps = [trainer.train_step(samples) for _ in range(3)]
    assert all(s["skipped"] == 0.0 for s in steps)
    moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, base[n])}
    assert moved and all(".lora_B." in n or ".lora_A." in n for n in moved)

    weights = list(trainer.full_weights(dtype=torch.bfloat16))
    assert weights and all(".lora_" in name for name, _ in weights)
    report, got = _round_to_a_receiver(trainer)
    assert report.num_bytes == sum(t.numel() * 2 for _, t in weights)
    assert got["checksum"] == checksum(weights)
    record(lora_gpu_update_bytes=report.num_bytes)


def _best_step_s(trainer: Trainer, samples, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        trainer.train_step(samples)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def test_step_time_at_8192_token_micro_batches_against_1024(monkeypatch):
    """Figures for docs/gpu.md (packed micro-batches, on GPU): tokens/s at two
    micro-batch budgets, with attention's `auto` choice (varlen for rows of many segments)
    and with one SDPA call per segment always (the CPU path)."""
    need_gpus(1)
    import learner.trainer.segment_attention as segment_attention

    samples = random_samples(num_samples=64, seed=11, min_len=128, max_len=1000)
    tokens = sum(len(s.token_ids) for s in samples)
    figures = {}
    for kernel in ("auto", "sdpa"):
        if kernel == "sdpa":
            monkeypatch.setattr(segment_attention, "varlen_applies", lambda *args: False)
        for budget in (1024, 8192):
            trainer = _trainer(_mid_size_qwen2(), micro_batch_tokens=budget)
            trainer.train_step(samples[:8])  # warm-up: kernels, allocator
            tokens_per_s = tokens / _best_step_s(trainer, samples)
            figures[f"learner_gpu_{kernel}_tokens_per_s_{budget}"] = round(tokens_per_s)
            del trainer
            torch.cuda.empty_cache()
        figures[f"learner_gpu_{kernel}_tokens_per_s_ratio_8192_vs_1024"] = round(
            figures[f"learner_gpu_{kernel}_tokens_per_s_8192"]
            / figures[f"learner_gpu_{kernel}_tokens_per_s_1024"],
            3,
        )
    record(**figures)


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    return ((got.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16", "fp32-autocast"])
def test_varlen_attention_equals_the_per_segment_path(autocast):
    need_gpus(1)
    from learner.trainer.segment_attention import attend_segments
    from learner.trainer.segments import Segments

    # Prefixes with suffixes longer and shorter than themselves (the causal alignment is
    # bottom-right only if suffix rows see the whole prefix), plain segments, length 1s.
    lengths = (200, 37, 150, 1, 300, 1, 64, 5, 90)
    parents = (-1, 0, 0, 0, -1, -1, -1, 6, -1)
    starts = tuple(sum(lengths[:k]) for k in range(len(lengths)))
    segments = Segments(starts=starts, lengths=lengths, parents=parents)
    gen = torch.Generator(device=CUDA).manual_seed(0)
    dtype = torch.float32 if autocast else torch.bfloat16
    qkv = [
        torch.randn(
            (1, 8, segments.num_tokens, 64), generator=gen, device=CUDA, dtype=dtype
        ).requires_grad_()
        for _ in range(3)
    ]
    upstream = torch.randn((1, 8, segments.num_tokens, 64), generator=gen, device=CUDA)
    results = {}
    for kernel in ("varlen", "sdpa"):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out = attend_segments(*qkv, segments, scale=0.125, kernel=kernel)
        grads = torch.autograd.grad(out, qkv, upstream.to(out.dtype))
        results[kernel] = (out, grads)
    out_v, grads_v = results["varlen"]
    out_s, grads_s = results["sdpa"]
    assert out_v.dtype == out_s.dtype == torch.bfloat16
    errors = [_relative(out_v, out_s)] + [
        _relative(a, b) for a, b in zip(grads_v, grads_s, strict=True)
    ]
    record(
        **{
            f"varlen_vs_sdpa_max_relative_error_{'autocast' if autocast else 'bf16'}": round(
                max(errors), 5
            )
        }
    )
    assert max(errors) < 2e-2, errors  # two bf16 kernels; a misaligned mask is off by O(1)
