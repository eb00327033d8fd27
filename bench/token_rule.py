"""The staleness rule per token against per group (learner.staleness_rule), where episodes
outlast weight updates: `make run`'s job with every calculator call first waiting a
log-normal latency with a 30 s tail (bench/agentic.py's `agentic-30s` workload), at each
staleness bound asked for, the `group` rule against the `token` rule, each over several
seeds (the seed draws the tool latencies; sampling is unseeded as in `make run`). Runs
alternate rule by rule within a seed, so both rules meet the same machine load.

Workloads: `calculator` (the demo's question, one call and the answer: two turns); `chain`
(demo/chain.py: four operands, three chained calls and the answer, from its own warm start:
four turns, so an episode's last turns can be fresher than its first); `chain-slow` and
`chain-long`, the same with every call slow (median 4 s and 12 s, the same 30 s p99), so an
episode lasts about one step, or several.

Per run: groups dropped as stale, policy tokens generated per policy token trained (what
the generation that was thrown away costs), seconds per step (steady state,
bench/async_support.py), loss tokens the token rule cleared, and the last eval's pass@1
(64 prompts x 2 samples after the last step). Per workload, bound and rule: the mean and
the range over seeds, as `<prefix>b<bound>_<rule>_<figure>_{mean,min,max}` (the prefixes:
RULE_WORKLOADS).

    python -m bench.token_rule [--workload NAME] [--bounds 1,2,4] [--seeds 0,1,2]

Writes bench/results/token_rule.json (keeping the figures of workloads and bounds not run
this time: each bound's two rules compare within one invocation) and
docs/images/token_rule.png, and prints the table. About 3 minutes a run on 2 cores (the
chains: 4-6).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.agentic import CORRECTION, EVAL_ROWS, EVAL_SAMPLES, WORKLOADS
from bench.async_support import GENERATED, mode_figures, workload_overrides
from bench.common import RESULTS_DIR, Benchmark, load_average, machine, report
from bench.tether_run import RunRecord, actor_counter_at, watch_run

BENCHMARK = Benchmark(
    measures="the staleness rule per token against per group, by workload and bound",
    target="by hand",
    minutes=20,
)

RULES = ("group", "token")
TAIL = WORKLOADS["agentic-30s"]


@dataclass(frozen=True)
class RuleWorkload:
    prefix: str  # of its figures' keys
    task: str  # "calculator" or "chain" (demo/chain.py)
    median_ms: float  # every tool call's log-normal latency
    p99_s: float


RULE_WORKLOADS = {
    "calculator": RuleWorkload("", "calculator", TAIL.median_ms, TAIL.p99_s),
    "chain": RuleWorkload("chain_", "chain", TAIL.median_ms, TAIL.p99_s),
    # Every call slow, not only the tail: each episode outlasts a step or two, so all of a
    # group's episodes span weight updates (with fast calls most finish under one version).
    "chain-slow": RuleWorkload("chainslow_", "chain", 4000, TAIL.p99_s),
    # Calls slower still: an episode lasts several steps, the regime of long agentic episodes.
    "chain-long": RuleWorkload("chainlong_", "chain", 12000, TAIL.p99_s),
}
PREFIXES = {name: w.prefix for name, w in RULE_WORKLOADS.items()}
FIGURES = ("stale_groups", "generated_per_trained", "s_per_step", "masked_fraction", "pass_at_1")
IMAGE = Path(__file__).resolve().parents[1] / "docs" / "images" / "token_rule.png"


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


def task_overrides(task: str, work: Path) -> list[str]:
    """The chain task's rows, warm start and turn limit (demo/chain.py); none for the demo's."""
    if task == "calculator":
        return []
    from demo.chain import ChainRecipe, write_task

    recipe = ChainRecipe()
    paths = write_task(work / "chain", recipe, num_eval=EVAL_ROWS)
    return [f"local.train_data={paths['train']}", f"local.eval_data={paths['eval']}",
            f"local.model_dir={paths['model']}",
            f"actor.rollout.max_turns={recipe.terms + 1}"]  # fmt: skip


def one_bound(
    bound: int, seeds: list[int], steps: int, work: Path, task: list[str], workload: RuleWorkload
) -> dict[str, float]:
    """Both rules at `bound`, over `seeds`: `<prefix>b<bound>_<rule>_<figure>_{mean,min,max}`."""
    prefix = workload.prefix
    base = workload_overrides(steps=steps, bound=bound, median_ms=workload.median_ms,
                              p99_s=workload.p99_s, eval_rows=EVAL_ROWS,
                              eval_samples=EVAL_SAMPLES)  # fmt: skip
    base += task + (CORRECTION if bound > 1 else [])
    group_size = 8  # configs/demo.toml's learner.group_size
    measured: dict[str, list[dict[str, float]]] = {rule: [] for rule in RULES}
    for seed in seeds:
        order = RULES if seed % 2 == 0 else RULES[::-1]
        for rule in order:
            overrides = [*base, f"learner.staleness_rule={rule}",
                         f"envserver.calculator.latency_seed={seed}"]  # fmt: skip
            run = watch_run(overrides, work / f"{prefix}b{bound}-{rule}{seed}")
            measured[rule].append(run_figures(run, group_size))
            print(f"{prefix}bound {bound} seed {seed} {rule}: {measured[rule][-1]}", flush=True)
    out = {f"{prefix}b{bound}_tool_median_ms": workload.median_ms,
           f"{prefix}b{bound}_tool_p99_s": workload.p99_s}  # fmt: skip
    for rule, runs in measured.items():
        for name in FIGURES:
            values = [r[name] for r in runs]
            key = f"{prefix}b{bound}_{rule}_{name}"
            out[f"{key}_mean"] = statistics.fmean(values)
            out[f"{key}_min"], out[f"{key}_max"] = min(values), max(values)
    return out


def kept_figures(prefix: str, rerun: list[int]) -> dict[str, float | int | str]:
    """The figures of the workloads and bounds not run this time, from the results file."""
    path = RESULTS_DIR / "token_rule.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    rerun_keys = {f"{prefix}b{bound}_" for bound in rerun}
    return {k: v for k, v in kept.items() if figure_key(k)
            and not any(k.startswith(r) for r in rerun_keys)}  # fmt: skip


def figure_key(key: str) -> tuple[str, int] | None:
    """(prefix, bound) of a per-bound key like `chain_b2_token_pass_at_1_mean`, else None."""
    for prefix in sorted(PREFIXES.values(), key=len, reverse=True):
        head = key[len(prefix) :].split("_")[0] if key.startswith(prefix) else ""
        if head[:1] == "b" and head[1:].isdigit():
            return prefix, int(head[1:])
    return None


def plot(figures: dict, path: Path) -> None:
    """Groups dropped as stale and tokens generated per token trained, by bound: a colour
    per workload, side by side around each bound; the group rule solid, the token rule open."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [key for key in map(figure_key, figures) if key]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for axis, (name, label) in zip(axes, (("stale_groups", "groups dropped as stale"),
                                          ("generated_per_trained", "generated per trained")),
                                   strict=True):  # fmt: skip
        for w, (workload, prefix) in enumerate(PREFIXES.items()):
            bounds = sorted({b for p, b in measured if p == prefix})
            for r, rule in enumerate(RULES):
                keys = [f"{prefix}b{b}_{rule}_{name}" for b in bounds]
                means = [figures[k + "_mean"] for k in keys]
                errors = [[figures[k + "_mean"] - figures[k + "_min"] for k in keys],
                          [figures[k + "_max"] - figures[k + "_mean"] for k in keys]]  # fmt: skip
                x = [b + 0.12 * (w - 1.5) + 0.04 * r for b in bounds]
                if bounds:
                    axis.errorbar(x, means, yerr=errors, marker="o", capsize=3, color=f"C{w}",
                                  mfc=f"C{w}" if rule == "group" else "white",
                                  linestyle="-" if rule == "group" else ":",
                                  label=f"{workload}, {rule}")  # fmt: skip
        axis.set_xlabel("staleness bound")
        axis.set_ylabel(label)
        axis.set_xticks(sorted({b for _, b in measured}))
    axes[1].legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=PREFIXES, default="calculator")
    parser.add_argument("--bounds", default="1,2,4")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    bounds = [int(b) for b in args.bounds.split(",")]
    workload = RULE_WORKLOADS[args.workload]
    prefix = workload.prefix
    out = kept_figures(prefix, bounds)
    out.update(steps=args.steps, seeds=len(seeds))
    with tempfile.TemporaryDirectory(prefix="bench-token-") as tmp:
        task = task_overrides(workload.task, Path(tmp))
        for bound in bounds:  # each bound's own provenance: kept bounds were measured apart
            with load_average() as loads:
                out.update(one_bound(bound, seeds, args.steps, Path(tmp), task, workload))
            out.update({f"{prefix}b{bound}_{k}": v for k, v in loads.items()})
            out[f"{prefix}b{bound}_measured_at"] = time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime()
            )
            out[f"{prefix}b{bound}_machine"] = machine()
    report("token_rule", "staleness rule per token vs per group, by workload and bound", out)
    plot(out, IMAGE)


if __name__ == "__main__":
    main()
