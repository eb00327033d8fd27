"""Dynamic sampling against none: `make run`'s job three times each way, one run
after the other, alternating (`learner.dynamic_sampling` true, then false, ...), on the same
machine.

Per run: eval pass@1 at v10 and at v30, the seconds from launch to the first eval at or
above 0.85 (evals every 5 versions: 100 prompts x 2 samples), the run's wall time, and the
filtered share (groups filtered for no reward signal / groups taken for training). Per mode:
the mean over its runs (a run that never reaches 0.85 counts as missing, said so).

    python -m bench.dynamic_sampling [--runs 3]

Writes bench/results/dynamic_sampling.json; docs/running.md quotes it ("Dynamic sampling").
About 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.common import Benchmark, load_average, report

BENCHMARK = Benchmark(
    measures="dynamic sampling against none on `make run`'s job",
    target="by hand",
    minutes=10,
)

TARGET = 0.85
PROMPTS_PER_STEP = 8  # configs/demo.toml's learner.prompts_per_step
MODES = {"on": "learner.dynamic_sampling=true", "off": "learner.dynamic_sampling=false"}


def run_figures(run, *, prompts_per_step: int) -> dict[str, float | None]:
    """One watched run's figures (bench/tether_run.py RunRecord)."""
    at = {r["version"]: r for r in run.evals}
    reached = next((r["t"] for r in run.evals if r["pass_at_1"] >= TARGET), None)
    filtered = sum(r.get("filtered_groups", 0) for r in run.train)
    taken = filtered + prompts_per_step * len(run.train)
    return {
        "pass_at_1_v10": at[10]["pass_at_1"] if 10 in at else None,
        "pass_at_1_v30": at[30]["pass_at_1"] if 30 in at else None,
        "s_to_target": reached,
        "wall_s": run.wall_s,
        "filtered_share": filtered / taken,
    }


def mean_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.mean(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per mode")
    parser.add_argument("--work-dir", type=Path, help="keep the runs here (default: temp)")
    args = parser.parse_args()

    from bench.tether_run import watch_run

    figures: dict[str, float | int | str] = {"runs": args.runs, "target": TARGET}
    measured: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with load_average() as loads, tempfile.TemporaryDirectory(prefix="bench-ds-") as tmp:
        work = args.work_dir or Path(tmp)
        for i in range(args.runs):
            for mode, override in MODES.items():
                print(f"run {i + 1}/{args.runs}, dynamic sampling {mode} ...", flush=True)
                (work / f"{mode}{i}").mkdir(parents=True, exist_ok=True)
                run = watch_run([override], work / f"{mode}{i}")
                measured[mode].append(run_figures(run, prompts_per_step=PROMPTS_PER_STEP))
    for mode, runs in measured.items():
        for i, run in enumerate(runs):
            figures.update({f"{mode}_run{i}_{k}": v for k, v in run.items() if v is not None})
        for key in runs[0]:
            value = mean_of(runs, key)
            if value is not None:
                figures[f"{mode}_{key}"] = value
        figures[f"{mode}_runs_reaching_target"] = sum(r["s_to_target"] is not None for r in runs)
    figures.update(loads)
    report("dynamic_sampling", "dynamic sampling on vs off, `make run`'s job", figures)


if __name__ == "__main__":
    main()
