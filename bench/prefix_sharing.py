"""Shared-prefix training: the learner's forward + backward step with and without sharing.

Three ways to run the same step (same samples, same weights, the trainer's loss: PPO-clip
`policy_loss` with `token_mean` weights, detached entropy as the trainer computes it):

    current:   today's trainer path: `plan_micro_batches` + `collate` (whole sequences in one
               packed row, position ids restarting per sequence, so transformers builds a
               dense block-diagonal N x N mask for sdpa), logits and log-softmax at every
               position; token budget `--current-budget` (1,024, as configs/demo.toml: the
               mask is quadratic in it).
    shared:    `plan_pieces` + `collate_segments` + `forward_loss_tokens` (segment attention,
               a group's common prefix once, logits only where the loss needs them); budget
               `--budget` (8,192).
    unshared:  the same path with sharing off (`min_shared_tokens` above any length): every
               sample a plain segment, i.e. boundary-respecting attention without a mask.
    `_1024`/`_8192` suffixes: the same at that token budget (the demo times the segment
    paths at 1,024 too, and measures the current path's memory at 8,192).

Workloads: (a) demo: 8 groups x 8 samples, a 148-token prompt identical within a group,
suffixes of 30-150 tokens (a tool observation in the middle carries no loss), the demo's
tiny Qwen2 (4 layers, hidden 128, 4 heads of 32, vocab 430, tied embeddings, random
weights); (b) synthetic: a 2,048-token shared prompt, groups of 16, suffixes of 64-256.

Step time = planning + collation + forward + backward over all micro-batches of the step
(no optimizer step), best of `--repeats`, the variants alternating in one process. torch
runs one thread (`--torch-threads`): the machines are shared 2-core boxes.

Memory: a fresh subprocess per variant builds the model and runs one step; reported are its
peak resident set during the step (Linux `VmHWM`, reset before the step) and that peak's
growth over the resident set before it (`measure_memory` says why not `getrusage`).

Also the unshared path's tokens/s at 8,192-token micro-batches over 1,024 (the target
is >= 0.9: attention that respects boundaries has no quadratic mask).

Writes bench/results/prefix_sharing.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench.common import Benchmark, print_table, write_results
from common.proc_memory import reset_peak, status_mib

BENCHMARK = Benchmark(
    measures="the learner's step with and without shared-prefix training",
    target="bench",
    minutes=4,
)

WORKLOADS = {  # groups x samples, prompt, suffix range
    "demo": dict(num_groups=8, group_size=8, prompt_len=148, min_suffix=30, max_suffix=150),
    "synthetic": dict(num_groups=2, group_size=16, prompt_len=2048, min_suffix=64, max_suffix=256),
}
VOCAB = 430
NO_SHARING = 10**9
MIN_SHARED_TOKENS = 16


def demo_model():
    """The demo's tiny Qwen2 shape (`demo.tinymodel.qwen2_config`, positions up to 4,096 for
    the synthetic workload) with random weights (fp32, eval-free: dropout is 0)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from demo.tinymodel import TinyModelRecipe, qwen2_config

    recipe = TinyModelRecipe(max_position_embeddings=4096)
    config = qwen2_config(recipe, vocab_size=VOCAB, eos_id=2, pad_id=0)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(torch.float32).train()


def workload(
    name: str,
    *,
    num_groups: int,
    group_size: int,
    prompt_len: int,
    min_suffix: int,
    max_suffix: int,
):
    """Samples of `num_groups` groups: a random prompt per group, then random suffixes whose
    middle fifth (a tool observation) carries no loss."""
    import numpy as np

    from learner.trainer.sample import Sample

    rng = np.random.default_rng(0)
    samples = []
    for g in range(num_groups):
        prompt = rng.integers(0, VOCAB, prompt_len)
        for k in range(group_size):
            n = int(rng.integers(min_suffix, max_suffix + 1))
            ids = np.concatenate([prompt, rng.integers(0, VOCAB, n)]).astype(np.int32)
            mask = np.zeros(len(ids), np.uint8)
            mask[prompt_len:] = 1
            mask[prompt_len + 2 * n // 5 : prompt_len + 3 * n // 5] = 0
            samples.append(
                Sample(
                    token_ids=ids,
                    loss_mask=mask,
                    behaviour_logprobs=np.where(mask == 1, -np.log(VOCAB), 0).astype(np.float32),
                    versions=np.zeros(len(ids), np.int32),
                    advantage=float(k % 2) - 0.5,
                    trajectory_id=f"{name}{g}-{k}",
                    group_id=f"{name}{g}",
                    env_class="calculator",
                )
            )
    return samples


def _backward(inputs, *, total_tokens: int, total_seqs: int) -> None:
    """The trainer's loss on one micro-batch (PPO-clip `policy_loss`, `token_mean` weights
    over the whole step), backward: the same in every variant."""
    from learner.trainer.config import AlgorithmConfig
    from learner.trainer.losses import policy_loss
    from learner.trainer.reductions import token_weights

    weights = token_weights(
        inputs.loss_mask,
        inputs.seq_ids,
        inputs.num_seqs,
        "token_mean",
        total_tokens=total_tokens,
        total_seqs=total_seqs,
    )
    (policy_loss(inputs, AlgorithmConfig()).loss * weights).sum().backward()


def current_step(model, samples, *, budget: int) -> int:
    """Today's trainer forward + backward; returns tokens trained."""
    import torch

    from bench.dense_packing import collate, plan_micro_batches
    from learner.trainer.losses import LossInputs, entropy_from_logits, token_logprobs

    (plan,) = plan_micro_batches([s.num_tokens for s in samples], num_ranks=1, token_budget=budget)
    total_tokens = sum(int(s.loss_mask.sum()) for s in samples)
    trained = 0
    for indices in plan:
        mb = collate([samples[i] for i in indices])
        logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False)
        logits = logits.logits[0]  # [N, V]
        zero = torch.zeros(1)
        logprobs = torch.cat([zero, token_logprobs(logits[:-1], mb.input_ids[0, 1:])])  # [N]
        entropy = torch.cat([zero, entropy_from_logits(logits[:-1].detach())])
        inputs = LossInputs(
            logprobs=logprobs,
            behaviour_logprobs=mb.behaviour_logprobs,
            advantages=mb.advantages,
            loss_mask=mb.loss_mask,
            seq_ids=mb.seq_ids,
            num_seqs=mb.num_seqs,
            entropy=entropy,
        )
        _backward(inputs, total_tokens=total_tokens, total_seqs=len(samples))
        trained += mb.num_tokens
    return trained


def segment_step(model, samples, *, budget: int, min_shared_tokens: int) -> int:
    """The shared-prefix forward + backward; returns tokens trained (as trained)."""
    from learner.trainer.prefix_plan import plan_pieces
    from learner.trainer.segment_forward import forward_loss_tokens, loss_inputs
    from learner.trainer.segments import collate_segments

    (plan,) = plan_pieces(
        samples, num_ranks=1, token_budget=budget, min_shared_tokens=min_shared_tokens
    )
    total_tokens = sum(int(s.loss_mask.sum()) for s in samples)
    trained = 0
    for pieces in plan:
        batch = collate_segments(samples, pieces)
        logprobs, entropy = forward_loss_tokens(model, batch, entropy="detached")
        inputs = loss_inputs(batch, logprobs, entropy=entropy)
        _backward(inputs, total_tokens=total_tokens, total_seqs=len(samples))
        trained += batch.num_tokens
    return trained


def variants(args):
    """name -> (needs segment attention, step function of (model, samples))."""

    def segments(budget: int, min_shared_tokens: int):
        return True, lambda m, s: segment_step(
            m, s, budget=budget, min_shared_tokens=min_shared_tokens
        )

    return {
        "current": (False, lambda m, s: current_step(m, s, budget=args.current_budget)),
        "current_8192": (False, lambda m, s: current_step(m, s, budget=8192)),
        "shared": segments(args.budget, MIN_SHARED_TOKENS),
        "unshared": segments(args.budget, NO_SHARING),
        "shared_1024": segments(1024, MIN_SHARED_TOKENS),
        "unshared_1024": segments(1024, NO_SHARING),
    }


# What each workload times and measures the memory of (the current path at 8,192 tokens is
# measured once, for its memory: timing it would take minutes).
TIMED = {
    "demo": ("current", "shared", "unshared", "shared_1024", "unshared_1024"),
    "synthetic": ("current", "shared", "unshared"),
}
MEMORY = {
    "demo": ("current", "current_8192", "shared", "unshared", "shared_1024", "unshared_1024"),
    "synthetic": ("current", "shared", "unshared"),
}


def timed(step, model, samples) -> tuple[float, int]:
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    tokens = step(model, samples)
    return time.perf_counter() - started, tokens


def measure_memory(args) -> None:
    """Subprocess mode: one step of one variant; prints a JSON line of resident-set MiB.

    The peak is the kernel's high-water mark of this process's memory, reset just before
    the step (`/proc/self/clear_refs` 5). Not `getrusage`: its `ru_maxrss` survives
    fork + exec, so a child started by the (bigger) benchmark process reports the parent's
    peak; tracemalloc does not see torch's allocations."""
    import torch

    from learner.trainer.segment_attention import use_segment_attention

    torch.set_num_threads(args.torch_threads)
    segmented, step = variants(args)[args.memory_variant]
    model = demo_model()
    if segmented:
        use_segment_attention(model)
    samples = workload(args.memory_workload, **WORKLOADS[args.memory_workload])
    before = reset_peak()["VmRSS"] / 1024  # MiB
    step(model, samples)
    peak = status_mib("VmHWM")
    print(json.dumps({"peak_rss_mib": peak, "step_rss_growth_mib": peak - before}))


def memory_in_subprocess(args, variant: str, name: str) -> dict[str, float]:
    command = [sys.executable, "-m", "bench.prefix_sharing", "--memory-variant", variant]
    command += ["--memory-workload", name]
    command += ["--budget", str(args.budget), "--current-budget", str(args.current_budget)]
    command += ["--torch-threads", str(args.torch_threads)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="best of N, alternating")
    parser.add_argument("--budget", type=int, default=8192, help="segment paths' token budget")
    parser.add_argument("--current-budget", type=int, default=1024)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--memory-variant", help=argparse.SUPPRESS)
    parser.add_argument("--memory-workload", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_variant:
        measure_memory(args)
        return

    import torch

    from learner.trainer.segment_attention import use_segment_attention

    torch.set_num_threads(args.torch_threads)
    plain_model = demo_model()
    segment_model = use_segment_attention(demo_model())
    figures: dict[str, float | int | str] = {}
    rows: list[tuple[str, object]] = []

    def report(key: str, label: str, value: float | int) -> None:
        figures[key] = value
        rows.append((label, value))

    for name, shape in WORKLOADS.items():
        samples = workload(name, **shape)
        chosen = {k: v for k, v in variants(args).items() if k in TIMED[name]}
        for segmented, step in chosen.values():  # warm-up
            timed(step, segment_model if segmented else plain_model, samples[:8])
        best: dict[str, float] = {}
        trained: dict[str, int] = {}
        for _ in range(args.repeats):
            for variant, (segmented, step) in chosen.items():
                seconds, trained[variant] = timed(
                    step, segment_model if segmented else plain_model, samples
                )
                best[variant] = min(best.get(variant, float("inf")), seconds)
        report(f"{name}_tokens_unshared", f"{name}: tokens, whole samples", trained["unshared"])
        report(f"{name}_tokens_shared", f"{name}: tokens as trained, shared", trained["shared"])
        for variant, seconds in best.items():
            report(f"{name}_{variant}_step_s", f"{name}: {variant} step (s)", seconds)
        for variant in MEMORY[name]:
            memory = memory_in_subprocess(args, variant, name)
            for key, value in memory.items():
                report(f"{name}_{variant}_{key}", f"{name}: {variant} {key}", value)
        for a, b in (("shared", "current"), ("shared", "unshared"), ("unshared", "current")):
            report(f"{name}_speedup_{a}_vs_{b}", f"{name}: speedup {a} / {b}", best[b] / best[a])
        if name == "demo":
            report(
                "unshared_tokens_per_s_ratio_8192_vs_1024",
                "demo: unshared tokens/s, budget 8192 / 1024",
                best["unshared_1024"] / best["unshared"],
            )
    figures.update(
        repeats=args.repeats,
        budget=args.budget,
        current_budget=args.current_budget,
        torch_threads=args.torch_threads,
    )
    print_table("prefix sharing: learner forward + backward step (1 process, CPU)", rows)
    write_results("prefix_sharing", figures)


if __name__ == "__main__":
    main()
