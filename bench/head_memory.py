"""Peak memory of the learner's language-model head alone, plain against chunked (#28).

    python -m bench.head_memory                     # U = 16,384 rows, V = 152,064, H = 896
    python -m bench.head_memory --rows 2048 --plain-rows 512 1024

Each measurement runs in a fresh process: hidden rows `[U, H]` and the head's weight `[V, H]`
(float32, CPU, random) are made, then one forward and backward of the loss's head terms
(each loss token's logprob, and the entropy with its gradient), as the learner's step does.
The figure is the process's resident high-water mark during that call (reset just before
it) minus its resident memory before it: what the head adds on top of the weights, the
weight's gradient ([V, H]) included. The plain head is measured at fewer rows (at 16,384 it
would need tens of GB); its growth is linear in the rows, which the table shows. Writes
bench/results/head_memory.json.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

from bench.common import reset_peak_rss, status_mib, write_results

HIDDEN, VOCAB = 896, 152_064


def _measure(rows: int, chunk_mb: float | None, queue) -> None:
    import torch
    import torch.nn.functional as F

    from learner.trainer.chunked_head import chunk_rows, head_terms

    torch.manual_seed(0)
    hidden = torch.randn(rows, HIDDEN, requires_grad=True)
    weight = torch.empty(VOCAB, HIDDEN).normal_(0, 0.02).requires_grad_()
    targets = torch.randint(0, VOCAB, (rows,))
    token_row = torch.arange(rows)
    before = reset_peak_rss()
    started = time.perf_counter()
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
    seconds = time.perf_counter() - started
    peak = status_mib("VmHWM")
    queue.put({"growth_mb": peak - before, "seconds": seconds})


def measure(rows: int, chunk_mb: float | None) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_measure, args=(rows, chunk_mb, queue))
    process.start()
    result = queue.get()
    process.join()
    return {"rows": rows, "chunk_mb": chunk_mb, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16_384)
    parser.add_argument("--plain-rows", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--chunk-mb", type=float, default=128.0)
    args = parser.parse_args()
    weight_grad_mb = VOCAB * HIDDEN * 4 / 2**20
    runs = [measure(rows, None) for rows in args.plain_rows]
    runs.append(measure(args.rows, args.chunk_mb))
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
    figures = {"vocab": VOCAB, "hidden": HIDDEN, "rows": args.rows, "chunk_mb": args.chunk_mb,
               "weight_grad_mb": round(weight_grad_mb, 1),
               "plain_extrapolated_mb": round(plain_at_rows),
               "chunked_mb": round(runs[-1]["growth_mb"]),
               "chunked_s": round(runs[-1]["seconds"], 1)}  # fmt: skip
    for run in runs[:-1]:
        figures[f"plain_{run['rows']}_rows_mb"] = round(run["growth_mb"])
    write_results("head_memory", figures)


if __name__ == "__main__":
    main()
