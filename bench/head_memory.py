"""Peak memory of the learner's language-model head alone, plain against chunked, at a real
vocabulary.

    python -m bench.head_memory                     # U = 16,384 rows, V = 152,064, H = 896
    python -m bench.head_memory --rows 2048 --plain-rows 512 1024
    python -m bench.head_memory --device cuda --dtype bfloat16 --hidden 896 3584

Each measurement runs in a fresh process: hidden rows `[U, H]` and the head's weight `[V, H]`
(float32, CPU, random) are made, then one forward and backward of the loss's head terms
(each loss token's logprob, and the entropy with its gradient), as the learner's step does.
The figure is the process's resident high-water mark during that call (reset just before
it) minus its resident memory before it: what the head adds on top of the weights, the
weight's gradient ([V, H]) included. The plain head is measured at fewer rows (at 16,384 it
would need tens of GB); its growth is linear in the rows, which the table shows. Writes
bench/results/head_memory.json.

`--device cuda` (a lent GPU, not `make bench`): the same on the GPU, the figure being
torch's peak allocation above what was allocated before the call; the plain head is then
measured at the full rows too where it fits, and the product runs in `--dtype` (bf16: the
learner's compute dtype on GPUs) at each `--hidden` (896: the scale ladder's largest shape;
3,584: a 7B's). Writes bench/results/head_memory_cuda.json.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

from bench.common import Benchmark, write_results
from common.proc_memory import reset_peak, status_mib

BENCHMARK = Benchmark(
    measures="the language-model head's peak memory, plain against chunked",
    target="by hand",
    minutes=5,
)

HIDDEN, VOCAB = 896, 152_064


def _head_step(hidden, weight, token_row, targets, chunk_mb: float | None) -> None:
    """One forward and backward of each loss token's logprob and the entropy."""
    import torch
    import torch.nn.functional as F

    from learner.trainer.chunked_head import chunk_rows, head_terms

    if chunk_mb is None:
        logits = F.linear(hidden, weight).float()
        lse = torch.logsumexp(logits, dim=-1)
        log_p = torch.log_softmax(logits, dim=-1)
        entropy = -(log_p.exp() * log_p).sum(-1)
        logprobs = logits[token_row, targets] - lse
    else:
        lse, entropy, picked = head_terms(
            hidden, weight, None, token_row, targets,
            rows=chunk_rows(VOCAB, chunk_mb), with_entropy=True,
        )  # fmt: skip
        logprobs = picked - lse
    (logprobs.sum() + 0.01 * entropy.sum()).backward()


def _measure(rows: int, chunk_mb: float | None, queue, device="cpu", dtype="float32",
             hidden_size=HIDDEN) -> None:  # fmt: skip
    import torch

    torch.manual_seed(0)
    cuda, dtype = device == "cuda", getattr(torch, dtype)
    hidden = torch.randn(rows, hidden_size, device=device, dtype=dtype, requires_grad=True)
    weight = torch.empty(VOCAB, hidden_size, device=device, dtype=dtype)
    weight = weight.normal_(0, 0.02).requires_grad_()
    targets = torch.randint(0, VOCAB, (rows,), device=device)
    token_row = torch.arange(rows, device=device)
    if cuda:  # kernels and cuBLAS set up outside the clock, their gradients dropped
        warm = hidden.detach()[:256].requires_grad_()
        _head_step(warm, weight, token_row[:256], targets[:256], chunk_mb)
        weight.grad = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    else:
        before = reset_peak()["VmRSS"] / 1024  # MiB
    started = time.perf_counter()
    try:
        _head_step(hidden, weight, token_row, targets, chunk_mb)
    except torch.OutOfMemoryError:
        queue.put({"oom": True})
        return
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = status_mib("VmHWM")
    queue.put({"growth_mb": peak - before, "seconds": time.perf_counter() - started})


def measure(rows: int, chunk_mb: float | None, **options) -> dict:
    """One run in a fresh process; an out-of-memory (CUDA) comes back as `oom`."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_measure, args=(rows, chunk_mb, queue), kwargs=options)
    process.start()
    process.join()
    result = queue.get() if not queue.empty() else {"failed": process.exitcode}
    return {"rows": rows, "chunk_mb": chunk_mb, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16_384)
    parser.add_argument("--plain-rows", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--chunk-mb", type=float, nargs="+", default=[128.0],
                        help="chunk budgets (CPU: the first)")  # fmt: skip
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--hidden", type=int, nargs="+", default=[HIDDEN])
    args = parser.parse_args()
    if args.device == "cuda":
        return main_cuda(args)
    weight_grad_mb = VOCAB * HIDDEN * 4 / 2**20
    runs = [measure(rows, None) for rows in args.plain_rows]
    runs.append(measure(args.rows, args.chunk_mb[0]))
    print(f"head alone: V = {VOCAB:,}, H = {HIDDEN}, float32 CPU; the weight's gradient "
          f"alone is {weight_grad_mb:.0f} MB")  # fmt: skip
    print(f"{'head':>8} {'rows U':>8} {'peak growth MB':>15} {'per 1K rows':>12} {'s':>7}")
    for run in runs:
        name = "plain" if run["chunk_mb"] is None else f"{run['chunk_mb']:g} MB"
        per_k = (run["growth_mb"] - weight_grad_mb) / run["rows"] * 1024
        print(f"{name:>8} {run['rows']:>8,} {run['growth_mb']:>15,.0f} {per_k:>12,.0f} "
              f"{run['seconds']:>7.1f}")  # fmt: skip
    plain = runs[-2]
    per_row = (plain["growth_mb"] - weight_grad_mb) / plain["rows"]
    plain_at_rows = weight_grad_mb + per_row * args.rows
    print(f"plain head extrapolated to {args.rows:,} rows: {plain_at_rows / 1024:,.1f} GB; "
          f"chunked, measured: {runs[-1]['growth_mb'] / 1024:.2f} GB")  # fmt: skip
    figures = {"vocab": VOCAB, "hidden": HIDDEN, "rows": args.rows, "chunk_mb": args.chunk_mb[0],
               "weight_grad_mb": round(weight_grad_mb, 1),
               "plain_extrapolated_mb": round(plain_at_rows),
               "chunked_mb": round(runs[-1]["growth_mb"]),
               "chunked_s": round(runs[-1]["seconds"], 1)}  # fmt: skip
    for run in runs[:-1]:
        figures[f"plain_{run['rows']}_rows_mb"] = round(run["growth_mb"])
    write_results("head_memory", figures)


def main_cuda(args) -> None:
    """Plain and chunked at the full rows on the GPU, per hidden size: peak and seconds."""
    import torch

    device = torch.cuda.get_device_name(0)
    print(f"head alone on {device}: U = {args.rows:,}, V = {VOCAB:,}, {args.dtype}")
    print(f"{'hidden':>7} {'head':>8} {'peak growth MB':>15} {'ms':>9}")
    figures: dict = {"device": device, "rows": args.rows, "dtype": args.dtype}
    for hidden in args.hidden:
        for chunk_mb in (None, *args.chunk_mb):
            run = measure(args.rows, chunk_mb, device="cuda", dtype=args.dtype,
                          hidden_size=hidden)  # fmt: skip
            name = "plain" if chunk_mb is None else f"{chunk_mb:g}MB"
            key = f"h{hidden}_{name}"
            if "growth_mb" not in run:
                print(f"{hidden:>7} {name:>8} {'OOM' if 'oom' in run else run}")
                figures[f"{key}_oom"] = True
                continue
            print(f"{hidden:>7} {name:>8} {run['growth_mb']:>15,.0f} "
                  f"{run['seconds'] * 1e3:>9,.1f}")  # fmt: skip
            figures[f"{key}_mb"] = round(run["growth_mb"])
            figures[f"{key}_ms"] = round(run["seconds"] * 1e3, 1)
    write_results("head_memory_cuda", figures)


if __name__ == "__main__":
    main()
