"""A trained adapter in the actors' engine against transformers + PEFT, greedy, token for
token: LoRA's parity check on a real run's adapter (the vLLM LoRA tests use
random adapters on a random model).

The adapter is a LoRA run's snapshot (`runs/<id>/weights/v<N>/`, a PEFT directory) of the
shipped demo model: of the run named by `--run`, or (as `make bench` runs it) of a LoRA demo
run trained first, `configs/demo_lora.toml` for `--version` steps on one engine. The first
PROMPTS eval prompts of the run's data are decoded greedily by transformers with the adapter
(PEFT's `PeftModel.from_pretrained`), then by one vLLM engine of each kind that loads the
same snapshot (`load_snapshot`): vLLM's LoRA (the adapter in its slot) and merged (the
adapter merged into the base weights). Prints how many prompts match token for token, and
writes bench/results/lora_parity.json.

    python -m bench.lora_parity [--run runs/latest] [--version 30] [--prompts 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from bench.common import Benchmark, print_table, write_results
from demo.engine import tiny_engine_settings
from demo.reference import hf_greedy

BENCHMARK = Benchmark(
    measures="a trained adapter in the engine against transformers + PEFT, token for token",
    target="bench",
    minutes=6.5,
)

REPO = Path(__file__).resolve().parent.parent

MODEL = REPO / "demo" / "tiny_model"
MAX_TOKENS = 48


async def _engine_outputs(enable_lora: bool, snapshot: Path, version: int, prompts, rank: int):
    from actors.config import SamplingConfig, VllmEngineConfig
    from actors.types import Turn
    from actors.vllm_engine import VllmEngine

    turn = Turn(SamplingConfig(temperature=0.0), MAX_TOKENS)
    engine = await VllmEngine.start(
        VllmEngineConfig(**tiny_engine_settings(MODEL), enable_lora=enable_lora, max_lora_rank=rank)
    )
    try:
        await engine.load_snapshot(str(snapshot), version)
        outputs = [await engine.generate(prompt, turn) for prompt in prompts]
    finally:
        engine.shutdown()
    assert all(o.versions == [version] * len(o.token_ids) for o in outputs)
    return [o.token_ids for o in outputs]


def train_lora_run(work: Path, steps: int) -> Path:
    """A LoRA demo run of `steps` steps (one engine, as `make run` on two cores); its
    directory, whose last snapshot is version `steps`."""
    from bench.tether_run import watch_run

    overrides = [f"learner.total_steps={steps}", "local.actor_replicas=1"]
    print(f"training a LoRA demo run of {steps} steps ...", flush=True)
    return watch_run(overrides, work, config=REPO / "configs" / "demo_lora.toml").run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a LoRA run's directory (default: train one)")
    parser.add_argument("--version", type=int, default=30, help="the snapshot to check")
    parser.add_argument("--prompts", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lora-parity-") as tmp:
        run = args.run or train_lora_run(Path(tmp), args.version)
        figures = parity(run, args.version, args.prompts)
    print_table("vLLM with the adapter vs transformers + PEFT (greedy)", list(figures.items()))
    write_results("lora_parity", figures)


def parity(run: Path, version: int, num_prompts: int) -> dict:
    """Greedy outputs of the engine, both kinds, against transformers + PEFT."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    snapshot = run / "weights" / f"v{version:06d}"
    rank = json.loads((snapshot / "adapter_config.json").read_text())["r"]
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    with open(run / "data" / "eval.jsonl") as rows:
        messages = [json.loads(line)["prompt"] for line in rows][:num_prompts]
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        for m in messages
    ]
    base = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    base_outputs = [hf_greedy(base, p, MAX_TOKENS, tokenizer.eos_token_id) for p in prompts]
    peft = PeftModel.from_pretrained(base, str(snapshot)).eval()
    reference = [hf_greedy(peft, p, MAX_TOKENS, tokenizer.eos_token_id) for p in prompts]
    figures = {
        "snapshot_version": version,
        "adapter_rank": rank,
        "prompts": len(prompts),
        "reference_tokens": sum(map(len, reference)),
        "prompts_the_adapter_changes": sum(
            a != b for a, b in zip(reference, base_outputs, strict=True)
        ),
    }
    for mode, enable_lora in (("vllm_lora", True), ("merged", False)):
        outputs = asyncio.run(_engine_outputs(enable_lora, snapshot, version, prompts, rank))
        figures[f"{mode}_prompts_equal"] = sum(
            a == b for a, b in zip(outputs, reference, strict=True)
        )
    return figures


if __name__ == "__main__":
    main()
