"""The staleness rule per token against per group (learner.staleness_rule), where episodes
outlast weight updates: `make run`'s job with every calculator call first waiting a
log-normal latency with a 30 s tail (bench/agentic.py's `agentic-30s` workload), at one
staleness bound, the `group` rule against the `token` rule, each over several seeds (the
seed draws the tool latencies; sampling is unseeded as in `make run`). Runs alternate rule
by rule within a seed, so both rules meet the same machine load.

Per run: groups dropped as stale, policy tokens generated per policy token trained (what
the generation that was thrown away costs), seconds per step (steady state,
bench/async_support.py), loss tokens the token rule cleared, and the last eval's pass@1
(64 prompts x 2 samples after the last step). Per rule: the mean and the range over seeds.

    python -m bench.token_rule [--bound 2] [--seeds 0,1,2] [--steps 12]

Writes bench/results/token_rule.json and prints the table. About 3 minutes a run on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.agentic import CORRECTION, EVAL_ROWS, EVAL_SAMPLES, WORKLOADS
from bench.async_support import GENERATED, mode_figures, workload_overrides
from bench.common import load_average, report
from bench.tether_run import RunRecord, actor_counter_at, watch_run

RULES = ("group", "token")
WORKLOAD = "agentic-30s"
FIGURES = ("stale_groups", "generated_per_trained", "s_per_step", "masked_fraction", "pass_at_1")


def run_figures(run: RunRecord, group_size: int) -> dict[str, float]:
    """What one run cost and reached (see the module docstring)."""
    train = run.train
    dropped = train[-1]["dropped_by_reason"].get("stale", 0)
    generated = actor_counter_at(run, GENERATED, train[-1]["t"])
    trained = sum(r["train/num_loss_tokens"] for r in train)
    masked = sum(r.get("stale_tokens_masked", 0) for r in train)
    return {
        "stale_groups": dropped / group_size,
        "generated_per_trained": generated / trained,
        "s_per_step": mode_figures(run)["s_per_step"],
        "masked_fraction": masked / (masked + trained),
        "pass_at_1": run.evals[-1]["eval/all/pass_at_1"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bound", type=int, default=2)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    workload = WORKLOADS[WORKLOAD]
    base = workload_overrides(steps=args.steps, bound=args.bound, median_ms=workload.median_ms,
                              p99_s=workload.p99_s, eval_rows=EVAL_ROWS,
                              eval_samples=EVAL_SAMPLES)  # fmt: skip
    base += CORRECTION if args.bound > 1 else []
    group_size = 8  # configs/demo.toml's learner.group_size
    measured: dict[str, list[dict[str, float]]] = {rule: [] for rule in RULES}
    out: dict[str, float | int | str] = {
        "bound": args.bound, "steps": args.steps, "seeds": len(seeds),
        "tool_median_ms": workload.median_ms, "tool_p99_s": workload.p99_s,
    }  # fmt: skip
    with load_average() as loads, tempfile.TemporaryDirectory(prefix="bench-token-") as tmp:
        for seed in seeds:
            order = RULES if seed % 2 == 0 else RULES[::-1]
            for rule in order:
                overrides = [*base, f"learner.staleness_rule={rule}",
                             f"envserver.calculator.latency_seed={seed}"]  # fmt: skip
                run = watch_run(overrides, Path(tmp) / f"{rule}{seed}")
                measured[rule].append(run_figures(run, group_size))
                print(f"seed {seed} {rule}: {measured[rule][-1]}", flush=True)
    for rule, runs in measured.items():
        for name in FIGURES:
            values = [r[name] for r in runs]
            out[f"{rule}_{name}_mean"] = statistics.fmean(values)
            out[f"{rule}_{name}_min"], out[f"{rule}_{name}_max"] = min(values), max(values)
    out.update(loads)
    report("token_rule", f"staleness rule per token vs per group, bound {args.bound}", out)


if __name__ == "__main__":
    main()
