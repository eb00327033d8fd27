"""Asynchrony where agents wait on tools: the speedup over synchronous RL when
tool calls are slow, at staleness bounds 1, 2 and 4, with work in flight sized by each
engine's room (actors/in_flight.py) against the fixed cap it replaced.

    workloads: bench/async.py's run (`make run`'s job, one replica) with every calculator
               call first waiting a log-normal latency:
                 tools        median 50 ms, p99 2 s   (bench/async.py's, "today's")
                 agentic      median 0.5 s, p99 8 s   (code execution, web, APIs)
                 agentic-30s  median 0.5 s, p99 30 s  (a heavier tail)
    modes:     sync     max_staleness 0: generation of step s waits for update s-1
               b1       bound 1, work in flight sized by the engine's room (the default)
               b2, b4   bounds 2 and 4, with TIS (ratio against the proximal policy,
                        truncated importance weight: bench/staleness.py's column)
               b1-cap8, b2-cap8: the same with `actor.max_groups_in_flight = 8`, the demo
                        config's fixed cap before the sizing (8 groups x 8 = max_num_seqs)

Per run (steady state, bench/async_support.py): seconds per step, learner and actor idle
fractions, the largest staleness trained on, and pass@1 of the last eval (after the last
step: 64 prompts x 2 samples, so 128 episodes: a binomial 95% band of about +-0.09 at
pass@1 0.5); `speedup` = the workload's synchronous seconds per step / this run's.

    python -m bench.agentic [--workloads tools,agentic] [--modes sync,b2] [--steps 12]

The block in docs/benchmarks.md adds, per workload, bench/async.py's GPU model computed
from its synchronous run (a MODEL, not a measurement: learner and engines on separate
devices).

Writes bench/results/agentic.json: `<workload>_<mode>_<figure>` for every run. About 25
minutes on 2 cores (`make bench-agentic`).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.async_support import mode_figures, workload_overrides
from bench.common import Benchmark, load_average, report

BENCHMARK = Benchmark(
    measures="asynchrony's speedup where agents wait on slow tools",
    target="bench-agentic",
    minutes=20,
)

EVAL_ROWS, EVAL_SAMPLES = 64, 2
CORRECTION = ["learner.algorithm.ratio_anchor=proximal", "learner.algorithm.importance_weight=tis"]
"""TIS as bench/staleness.py measured it (docs/benchmarks.md, "staleness")."""


@dataclass(frozen=True)
class Workload:
    median_ms: float
    p99_s: float
    modes: tuple[str, ...]


@dataclass(frozen=True)
class Mode:
    bound: int
    cap: int | None = None

    def overrides(self) -> list[str]:
        out = []
        if self.bound > 1:  # further off-policy than one version: correct for it
            out += CORRECTION
        if self.cap is not None:
            out.append(f"actor.max_groups_in_flight={self.cap}")
        return out


MODES = {
    "sync": Mode(0),
    "b1": Mode(1),
    "b2": Mode(2),
    "b4": Mode(4),
    "b1-cap8": Mode(1, cap=8),
    "b2-cap8": Mode(2, cap=8),
}
WORKLOADS = {
    "tools": Workload(50, 2.0, ("sync", "b1-cap8", "b1")),
    "agentic": Workload(500, 8.0, ("sync", "b1", "b2", "b4", "b2-cap8")),
    "agentic-30s": Workload(500, 30.0, ("sync", "b2", "b4")),
}


def run_figures(run) -> dict[str, float]:
    """`mode_figures` and the last eval's pass@1 (its version: the run's last)."""
    figures = mode_figures(run)
    last_eval = run.evals[-1]
    figures.update(pass_at_1=last_eval["pass_at_1"], eval_version=last_eval["version"])
    return figures


def with_speedups(measured: dict[str, dict[str, float]]) -> dict[str, float]:
    """Flat `<mode>_<figure>` of one workload's runs, each with its speedup over `sync`."""
    out: dict[str, float] = {}
    sync = measured.get("sync")
    for mode, figures in measured.items():
        if sync is not None:
            figures = {**figures, "speedup": sync["s_per_step"] / figures["s_per_step"]}
        out.update({f"{mode}_{key}": value for key, value in figures.items()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="which, comma-separated")
    parser.add_argument("--modes", help="only these modes (default: each workload's own)")
    parser.add_argument("--steps", type=int, default=12, help="learner steps per run")
    parser.add_argument("--work-dir", type=Path, help="keep the runs here (default: temp)")
    args = parser.parse_args()
    only = set(args.modes.split(",")) if args.modes else None

    from bench.tether_run import watch_run

    figures: dict[str, float | int | str] = {"steps": args.steps}
    with load_average() as loads, tempfile.TemporaryDirectory(prefix="bench-agentic-") as tmp:
        work = args.work_dir or Path(tmp)
        for name in args.workloads.split(","):
            workload = WORKLOADS[name]
            figures[f"{name}_tool_median_ms"] = workload.median_ms
            figures[f"{name}_tool_p99_s"] = workload.p99_s
            measured = {}
            for mode_name in workload.modes:
                if only is not None and mode_name not in only:
                    continue
                mode = MODES[mode_name]
                print(f"{name} {mode_name}: {mode} ...", flush=True)
                overrides = workload_overrides(
                    steps=args.steps,
                    bound=mode.bound,
                    median_ms=workload.median_ms,
                    p99_s=workload.p99_s,
                    eval_rows=EVAL_ROWS,
                    eval_samples=EVAL_SAMPLES,
                )
                run_dir = work / name / mode_name
                run_dir.mkdir(parents=True, exist_ok=True)
                run = watch_run(overrides + mode.overrides(), run_dir)
                measured[mode_name] = run_figures(run)
            figures.update({f"{name}_{k}": v for k, v in with_speedups(measured).items()})
    figures.update(loads)
    report("agentic", "asynchrony with slow tools (speedup: over the sync mode)", figures)


if __name__ == "__main__":
    main()
