"""A staleness bound that sets itself (`learner.max_staleness = "auto"`) against fixed
bounds, each workload against its synchronous run or bound 1 in the same invocation:
bench/agentic.py's workloads (`make run`'s job with every calculator call first waiting a
log-normal latency) plus `instant`, a calculator that answers at once.

    workload   compared                 what it asks
    instant    b1, auto                 the bound stays low where tools cost nothing
    tools      b1, auto                 50 ms / 2 s: no slower than bound 1
    agentic    sync, auto (+ b4)        0.5 s / 8 s: the speedup over synchronous RL
    demo       b1, auto                 `make run` as shipped (30 steps, its evals): auto
                                        ends in bound 1's pass@1 band

Per run: bench/agentic.py's figures (seconds per step, idle fractions, last pass@1) and
the bound step by step (`bounds`, its mean and last); `speedup` = the compared baseline's
seconds per step / this run's (sync where the workload has it, else b1). Seeds draw the
tool latencies (sampling is unseeded, as in `make run`).

    python -m bench.auto_bound [--workloads instant,tools,agentic] [--seeds 0] [--steps 12]

Writes bench/results/auto_bound.json (and docs/images/auto_bound.png, the bound by step of
every auto run), keeping the figures of workloads not run this time.
About 2 minutes a run on 2 cores (a synchronous one on the slow tools: 4 at 24 steps).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import tomllib
from pathlib import Path

from bench.agentic import CORRECTION, EVAL_ROWS, EVAL_SAMPLES, WORKLOADS, run_figures
from bench.async_support import workload_overrides
from bench.common import RESULTS_DIR, Benchmark, load_average, report

BENCHMARK = Benchmark(
    measures="a staleness bound that sets itself against fixed bounds",
    target="by hand",
    minutes=40,
)

PLAN = {  # workload -> (modes, baseline)
    "instant": (("b1", "auto"), "b1"),
    "tools": (("b1", "auto"), "b1"),
    "agentic": (("sync", "auto", "b4"), "sync"),
    "demo": (("b1", "auto"), "b1"),
}
BOUNDS = {"sync": 0, "b1": 1, "b4": 4, "auto": "auto"}
REPO = Path(__file__).resolve().parents[1]
DEMO_STEPS = tomllib.loads((REPO / "configs" / "demo.toml").read_text())["learner"]["total_steps"]
IMAGE = REPO / "docs" / "images" / "auto_bound.png"


def latency(workload: str) -> tuple[float, float]:
    """(median ms, p99 s) of a workload's tool calls; `instant`'s answer at once."""
    if workload == "instant":
        return 0.0, 0.0
    return WORKLOADS[workload].median_ms, WORKLOADS[workload].p99_s


def overrides_of(workload: str, mode: str, seed: int, steps: int) -> list[str]:
    """The run's overrides of configs/demo.toml; `demo` is the shipped run, its bound aside."""
    bound = BOUNDS[mode]
    if workload == "demo":
        return [f"learner.max_staleness={bound}"]
    median_ms, p99_s = latency(workload)
    overrides = workload_overrides(steps=steps, bound=bound, median_ms=median_ms, p99_s=p99_s,
                                   eval_rows=EVAL_ROWS, eval_samples=EVAL_SAMPLES)  # fmt: skip
    overrides += [f"envserver.calculator.latency_seed={seed}"]
    if isinstance(bound, int) and bound > 1:
        overrides += CORRECTION  # as bench/agentic.py runs its fixed bounds
    return overrides


def one_run(workload: str, mode: str, seed: int, steps: int, work: Path) -> dict[str, float]:
    from bench.tether_run import watch_run

    bound = BOUNDS[mode]
    overrides = overrides_of(workload, mode, seed, steps)
    run_dir = work / f"{workload}-{mode}-{seed}"
    run_dir.mkdir(parents=True)
    run = watch_run(overrides, run_dir)
    figures = run_figures(run)
    bounds = [r.get("max_staleness", bound) for r in run.train]
    figures.update(bound_mean=sum(bounds) / len(bounds), bound_last=bounds[-1])
    figures["bounds"] = ",".join(map(str, bounds))
    return figures


def plot(figures: dict, path: Path) -> None:
    """The bound in force step by step: every auto run, per workload and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(9.5, 3.2))
    for key, value in sorted(figures.items()):
        if "_auto_" in key and key.endswith("_bounds"):
            bounds = [int(b) for b in value.split(",")]
            steps = range(1, len(bounds) + 1)
            axis.step(steps, bounds, where="post", label=key.removesuffix("_bounds"))
    axis.set_xlabel("training step")
    axis.set_ylabel("staleness bound in force")
    axis.set_yticks(range(0, 5))
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside the lines
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


def kept_figures(rerun: list[str]) -> dict[str, float | int | str]:
    """The figures of the workloads not run this time, from the results file: each
    workload's runs compare within one invocation, and a slow workload need not be run
    again with a quick one."""
    path = RESULTS_DIR / "auto_bound.json"
    if not path.exists():
        return {}
    kept = json.loads(path.read_text())
    return {k: v for k, v in kept.items() if k.split("_")[0] in set(PLAN) - set(rerun)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(PLAN))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--modes", help="only these modes (default: each workload's own)")
    parser.add_argument("--work-dir", type=Path, help="keep the runs here (default: temp)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    workloads = args.workloads.split(",")
    out = kept_figures(workloads)
    with load_average() as loads, tempfile.TemporaryDirectory(prefix="bench-auto-") as tmp:
        work = args.work_dir or Path(tmp)
        for workload in workloads:
            steps = DEMO_STEPS if workload == "demo" else args.steps
            out.update({f"{workload}_steps": steps, f"{workload}_seeds": len(seeds)})
            modes, baseline = PLAN[workload]
            modes = [m for m in modes if not args.modes or m in args.modes.split(",")]
            for seed in seeds:
                runs = {}
                for mode in modes:
                    runs[mode] = one_run(workload, mode, seed, steps, work)
                    print(f"{workload} {mode} seed {seed}: {runs[mode]}", flush=True)
                for mode, figures in runs.items():
                    if baseline in runs:
                        figures["speedup"] = runs[baseline]["s_per_step"] / figures["s_per_step"]
                    out.update({f"{workload}_{mode}_s{seed}_{k}": v for k, v in figures.items()})
    out.update(loads)
    report("auto_bound", "an auto staleness bound against fixed ones", out)
    plot(out, IMAGE)


if __name__ == "__main__":
    main()
