"""What an adapter update costs an engine, against a full-weight update of the same engine.

The shipped demo model (0.84M params, fp32) with a LoRA adapter of rank RANK on every linear
layer of the decoder. Two engines, one after the other: one with vLLM's LoRA (`enable_lora`:
the adapter goes into its slot) and one without (the adapter is merged into the base
weights, which are reloaded). Each takes ROUNDS full-weight rounds (the baseline) and ROUNDS
adapter rounds from a learner-side `WeightSender`, on an idle engine. The figures: bytes
per update and the median stall (pause -> resume), and each adapter stall over the same
engine's full-weight stall.

    python -m bench.lora_sync [--rounds 8] [--rank 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
from pathlib import Path

from bench.common import Benchmark, load_average, print_table, write_results

BENCHMARK = Benchmark(
    measures="an adapter update's cost to an engine against a full-weight update",
    target="bench",
    minutes=1,
)

REPO = Path(__file__).resolve().parent.parent

MODEL = REPO / "demo" / "tiny_model"


async def _round(engine, sender, weights, version: int):
    from weights.actor_side.subscription import WeightSubscription

    subscription = WeightSubscription(
        sender.config.store_host, sender.config.store_port, max_lora_rank=engine.max_lora_rank
    )
    result = {}
    thread = threading.Thread(
        target=lambda: result.setdefault("report", sender.broadcast(version, weights))
    )
    try:
        thread.start()
        ticket = await asyncio.to_thread(subscription.wait_round, engine.version, 60.0)
        update = await engine.update_weights(ticket)
        await asyncio.to_thread(thread.join)
    finally:
        subscription.leave()
    assert result["report"].ok, result["report"]
    return result["report"].num_bytes, update.stall_s


async def _measure(enable_lora: bool, rank: int, rounds: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from actors.config import VllmEngineConfig
    from actors.vllm_engine import VllmEngine
    from learner.trainer.config import FinetuneConfig
    from learner.trainer.lora import adapter_config, add_lora
    from weights.config import WeightSyncConfig
    from weights.learner_side.adapter import adapter_parameters
    from weights.learner_side.sender import WeightSender

    finetune = FinetuneConfig(mode="lora", rank=rank, alpha=2 * rank)
    model = add_lora(AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32), finetune)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(std=0.01)
    adapter = list(adapter_parameters(model))
    full = list(AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).named_parameters())
    sync = WeightSyncConfig(store_port=0, join_timeout_s=30.0, transfer_timeout_s=60.0)
    full_sender = WeightSender(sync)
    lora_sender = WeightSender(sync, adapter_config=adapter_config(finetune, str(MODEL)))
    engine = await VllmEngine.start(
        VllmEngineConfig(
            model=str(MODEL), max_model_len=1024, enable_lora=enable_lora, max_lora_rank=rank
        )
    )
    try:
        full_stalls, lora_stalls = [], []
        for _ in range(rounds):
            full_bytes, stall = await _round(engine, full_sender, full, engine.version + 1)
            full_stalls.append(stall)
        for _ in range(rounds):
            lora_bytes, stall = await _round(engine, lora_sender, adapter, engine.version + 1)
            lora_stalls.append(stall)
    finally:
        engine.shutdown()
        full_sender.close()
        lora_sender.close()
    full_ms, lora_ms = statistics.median(full_stalls) * 1e3, statistics.median(lora_stalls) * 1e3
    return {
        "full_bytes": full_bytes,
        "adapter_bytes": lora_bytes,
        "full_stall_ms_median": round(full_ms, 1),
        "adapter_stall_ms_median": round(lora_ms, 1),
        "adapter_over_full_stall": round(lora_ms / full_ms, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    with load_average() as loads:
        native = asyncio.run(_measure(True, args.rank, args.rounds))
        merged = asyncio.run(_measure(False, args.rank, args.rounds))
    figures = {
        "rounds": args.rounds,
        "rank": args.rank,
        "full_bytes_per_update": native["full_bytes"],
        "adapter_bytes_per_update": native["adapter_bytes"],
        "adapter_over_full_bytes": round(native["adapter_bytes"] / native["full_bytes"], 3),
        "vllm_lora_full_stall_ms": native["full_stall_ms_median"],
        "vllm_lora_adapter_stall_ms": native["adapter_stall_ms_median"],
        "vllm_lora_adapter_over_full_stall": native["adapter_over_full_stall"],
        "merged_full_stall_ms": merged["full_stall_ms_median"],
        "merged_adapter_stall_ms": merged["adapter_stall_ms_median"],
        "merged_adapter_over_full_stall": merged["adapter_over_full_stall"],
        **loads,
    }
    print_table("LoRA adapter updates vs full-weight updates (idle engine)", list(figures.items()))
    write_results("lora_sync", figures)


if __name__ == "__main__":
    main()
