"""The learner's training step on one GPU at real sizes: peak memory and speed, head chunked
against plain. Needs CUDA; run on a lent GPU machine, not by `make bench`.

    python -m bench.gpu_learner                         # 0.5B and 1.5B shapes, 16,384 tokens
    python -m bench.gpu_learner --shapes 0.5B --tokens 8192 --steps 2

Per shape and head, in a fresh process (clean CUDA memory statistics; an out-of-memory is a
figure, not a crash): a random Qwen2 of that shape over Qwen2's 151,936 embedding rows,
built on the GPU in fp32 (master weights), the real `Trainer` computing in bf16 (autocast)
with one micro-batch of `--tokens` tokens per step: groups of 4 samples sharing a 256-token
prompt (shared as the learner shares it), 3/4 of each response a loss token. One warm-up
step, then `--steps` timed ones. Figures: the training state (fp32 weights, gradients and
AdamW's two moments: 16 bytes a parameter), the peak CUDA allocation over the run (torch's
allocator, `max_memory_allocated`) and over that state, trained tokens per second. Writes
bench/results/gpu_learner.json.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

from bench.common import Benchmark, write_results
from common.proc_memory import status_mib
from demo.random_model import LADDER, Shape

BENCHMARK = Benchmark(
    measures="the learner's step on one GPU at real sizes (needs a GPU)",
    target="by hand",
    minutes=5,
)

SHAPES = {shape.name: shape for shape in LADDER} | {
    "1.5B": Shape("1.5B", hidden=1536, layers=28, intermediate=8960, heads=12, kv_heads=2),
}
PROMPT_TOKENS, GROUP = 256, 4


def head_budget(head: str) -> float | None:
    """`plain`, or `chunked-<MB>` (the head's chunk budget)."""
    return None if head == "plain" else float(head.removeprefix("chunked-"))


def _samples(tokens: int, vocab: int):
    """Groups of `GROUP` samples filling `tokens` (each shared prompt counted once)."""
    import numpy as np

    from learner.trainer.sample import Sample

    rng = np.random.default_rng(0)
    groups = max(1, tokens // (PROMPT_TOKENS + GROUP * 1024))
    response = (tokens // groups - PROMPT_TOKENS) // GROUP
    samples = []
    for g in range(groups):
        prompt = rng.integers(5, vocab, PROMPT_TOKENS, dtype=np.int32)
        for i in range(GROUP):
            ids = np.concatenate([prompt, rng.integers(5, vocab, response, dtype=np.int32)])
            mask = np.zeros(len(ids), np.uint8)
            mask[PROMPT_TOKENS + response // 4 :] = 1
            samples.append(
                Sample(
                    token_ids=ids, loss_mask=mask,
                    behaviour_logprobs=np.full(len(ids), -11.0, np.float32),
                    versions=np.zeros(len(ids), np.int32), advantage=1.0 if i % 2 else -1.0,
                    trajectory_id=f"t{g}-{i}", group_id=f"g{g}", env_class="bench",
                )
            )  # fmt: skip
    return samples


def _measure(shape_name, head, tokens, steps, device, checkpointing, queue) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from learner.trainer.config import TrainerConfig
    from learner.trainer.trainer import Trainer

    shape = SHAPES[shape_name]
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape.config(), dtype=torch.float32)
    config = TrainerConfig.model_validate({
        "model_path": "random", "dtype": "bfloat16", "micro_batch_tokens": tokens,
        "head_chunk_mb": head_budget(head), "total_steps": steps + 1,
        "gradient_checkpointing": checkpointing,
    })  # fmt: skip
    trainer = Trainer(model, config, device=torch.device(device))
    peak_gb = _peak_gb_reader(device)
    samples = _samples(tokens, shape.vocab)
    params = sum(p.numel() for p in model.parameters())
    result = {"shape": shape_name, "head": head, "params": params, "state_gb": params * 16 / 1e9}
    try:
        trainer.train_step(samples)  # warm-up: kernels, the allocator, AdamW's state
        started, trained = time.perf_counter(), 0
        for _ in range(steps):
            trained += trainer.train_step(samples)["num_trained_tokens"]
        peak_gb()  # synchronizes
        result["tokens_per_s"] = trained / (time.perf_counter() - started)
    except torch.OutOfMemoryError as e:
        result["oom"] = str(e).splitlines()[0][:200]
    result["peak_gb"] = peak_gb()
    result["peak_over_state"] = result["peak_gb"] / result["state_gb"]
    queue.put(result)


def _peak_gb_reader(device: str):
    """The run's peak: torch's CUDA allocator on a GPU; resident memory on CPU (a
    rehearsal: the process's high-water mark, the model's build included)."""
    import torch

    if device == "cuda":
        return lambda: (torch.cuda.synchronize(), torch.cuda.max_memory_allocated() / 1e9)[1]
    return lambda: status_mib("VmHWM") * 2**20 / 1e9


def measure(shape: str, head: str, tokens: int, steps: int, device: str, ckpt: bool) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    args = (shape, head, tokens, steps, device, ckpt, queue)
    process = context.Process(target=_measure, args=args)
    process.start()
    process.join()
    if queue.empty():
        return {"shape": shape, "head": head, "error": f"exit code {process.exitcode}"}
    return queue.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["0.5B", "1.5B"], choices=SHAPES)
    parser.add_argument("--heads", nargs="+", default=["chunked-128", "plain"],
                        help="plain, or chunked-<MB>")  # fmt: skip
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--tokens", type=int, default=16_384)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a rehearsal at small sizes (resident memory)")  # fmt: skip
    args = parser.parse_args()
    import platform

    import torch

    runs = [
        measure(s, h, args.tokens, args.steps, args.device, args.gradient_checkpointing)
        for s in args.shapes
        for h in args.heads
    ]
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.machine()
    ckpt = ", gradient checkpointing" if args.gradient_checkpointing else ""
    print(f"{device}: one micro-batch of {args.tokens:,} tokens a step, bf16 over fp32 "
          f"masters{ckpt}")  # fmt: skip
    print(f"{'shape':>6} {'head':>12} {'state GB':>9} {'peak GB':>8} {'x state':>8} {'tok/s':>9}")
    figures: dict = {"device": device, "tokens": args.tokens,
                     "gradient_checkpointing": args.gradient_checkpointing}  # fmt: skip
    for run in runs:
        if "error" in run:
            print(f"{run['shape']:>6} {run['head']:>12} {run['error']}")
            continue
        speed = "OOM" if "oom" in run else f"{run['tokens_per_s']:,.0f}"
        print(f"{run['shape']:>6} {run['head']:>12} {run['state_gb']:>9.1f} "
              f"{run['peak_gb']:>8.1f} {run['peak_over_state']:>8.2f} {speed:>9}")  # fmt: skip
        key = f"{run['shape']}_{run['head']}{'_ckpt' if args.gradient_checkpointing else ''}"
        figures[f"{key}_peak_gb"] = round(run["peak_gb"], 2)
        figures[f"{key}_state_gb"] = round(run["state_gb"], 2)
        figures[f"{key}_tokens_per_s"] = round(run.get("tokens_per_s", 0.0))
        figures[f"{key}_oom"] = "oom" in run
    write_results("gpu_learner", figures)


if __name__ == "__main__":
    main()
