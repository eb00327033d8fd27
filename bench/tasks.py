"""RL on tasks nobody here wrote: reasoning-gym task families, each warm-started from its own
rows (demo/warmstart.py), then trained by the real system and compared with plain SFT.

Per family and seed:
  1. rows   `learner prepare --from reasoning_gym:TASK --size N --seed S --task-config ...`
            for training, and NUM_EVAL_ROWS more drawn with another seed for evaluation:
            fresh draws of the task's own generator, as reasoning-gym evaluates. The
            families' question spaces are small (chain_sum with two one-digit terms asks
            ~190 questions), so most eval questions are also asked in training: the table
            measures learning the task's distribution. A split by question (prepare's
            eval split) would hold out facts nobody can infer from the others (the sum of
            two digits, the legs of an animal): there neither RL nor SFT moved pass@1
            (chain_sum seed 0: start 0.371, RL 0.359, SFT 0.328 after 30 steps).
  2. warm   `demo.warmstart` on the train rows from the shipped model, stopped once expected
            pass@1 on held-out train rows reaches STOP_AT (well below the ceiling)
  3. RL     `python -m deploy.local` (configs/demo.toml; the run's rows, `local.model_dir` the
            warm start, `envserver.envs = ["reasoning_gym:TASK"]`) for STEPS steps; its weight
            snapshots are kept as they appear (bench/tether_run.py)
  4. SFT    the control: the warm start continued with plain SFT (demo.warmstart with
            `--init` the warm start, on its own solved rows, no early stop) for the same STEPS
            optimizer steps, its weights saved every SNAPSHOT_EVERY steps

Every pass@1 is measured the same way (bench/pass_at_1.py's Evaluator: one vLLM engine, the
task's own env in process, the demo's episode limits, temperature 1, 2 seeded samples per row,
the same seeds for every checkpoint) on the same held-out eval rows: the warm start (step 0),
then RL's snapshots and SFT's checkpoints every SNAPSHOT_EVERY steps.

Per family, over the seeds: start, RL end and SFT end pass@1 (means), the 95% band of a
difference of two such means (binomial, over all the eval episodes of the seeds), and whether
RL's end is above its start and above SFT's end by more than the band (`held`).

    python -m bench.tasks [--families chain_sum,count_bits] [--seeds 0,1,2] [--steps 30]

Writes bench/results/tasks.json and docs/images/tasks_pass_at_1.png and prints the markdown
table (bench/render/tasks.py, rendered into docs/benchmarks.md). About half an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import Benchmark, load_average, report
from bench.render.tasks import tasks as render_tasks

BENCHMARK = Benchmark(
    measures="RL on reasoning-gym families against plain SFT",
    target="by hand",
    minutes=30,
)

REPO = Path(__file__).resolve().parents[1]
PLOT = REPO / "docs" / "images" / "tasks_pass_at_1.png"
NUM_ROWS, NUM_EVAL_ROWS, EVAL_SAMPLES = 3000, 128, 2
EVAL_SEED = 10_000
"""The eval rows of seed S are drawn with seed EVAL_SEED + S."""
STOP_AT = 0.3
"""The warm start stops once expected pass@1 on its check rows reaches this."""
RL_LR, RL_PROMPTS_PER_STEP = 2e-4, 32
"""RL's step: 32 prompts (the control's batch) of configs/demo.toml's 8 samples each, at
2e-4. On chain_sum (seed 0, 30 steps) 8 prompts a step at 1e-4 or 2e-4 moved pass@1 by
+0.00-0.02; at 4e-4 and above the policy falls apart within 10 steps (0.46 -> 0.32)."""
SFT_LR = 1e-3
"""The control continues at the warm start's own peak learning rate (demo/warmstart.py),
warming a fresh optimizer up over the first third of its steps (at full rate at once, its
first steps undo part of the warm start: 0.37 -> 0.16 after 10 steps on chain_sum)."""
CONTROL_FRACTION = 0.25
"""The control continues on the warm start's solved rows (demo/warmstart.py's default
fraction): SFT with the answers it had, against RL with a scorer on every prompt."""


@dataclass(frozen=True)
class Family:
    task: str
    config: dict = field(default_factory=dict)
    """reasoning-gym task config, made easy enough for a 0.9M-parameter model."""


FAMILIES = {
    "chain_sum": Family("chain_sum", {"min_terms": 2, "max_terms": 2, "max_digits": 1}),
    "count_bits": Family("count_bits", {"max_n": 255}),
    "leg_counting": Family(
        "leg_counting", {"min_animals": 1, "max_animals": 1, "max_instances": 3}
    ),
}


# -- pure helpers -------------------------------------------------------------------------


def prepare_command(family: Family, *, seed: int, size: int, out_dir: Path) -> list[str]:
    """`learner prepare --from reasoning_gym:TASK` as a user types it, every row in
    `train.jsonl` (the bench draws its eval rows with a seed of their own)."""
    command = [sys.executable, "-m", "learner.cli", "prepare", "--from",
               f"reasoning_gym:{family.task}", "--size", str(size), "--seed", str(seed),
               "--eval-fraction", "0", "--output-dir", str(out_dir)]  # fmt: skip
    for key, value in family.config.items():
        command += ["--task-config", f"{key}={json.dumps(value)}"]
    return command


def rl_overrides(
    family: Family,
    *,
    data_dir: Path,
    model_dir: Path,
    steps: int,
    snapshot_every: int,
    lr: float = RL_LR,
) -> list[str]:
    """configs/demo.toml turned to the family's rows, env and warm start."""
    return [
        f"local.train_data={data_dir / 'train.jsonl'}",
        f"local.eval_data={data_dir / 'eval_bench.jsonl'}",
        f"local.model_dir={model_dir}",
        f'envserver.envs=["reasoning_gym:{family.task}"]',
        f"learner.total_steps={steps}",
        f"learner.eval_interval={steps}",
        f"learner.snapshot_interval={snapshot_every}",
        f"learner.optim.lr={lr}",
        f"learner.prompts_per_step={RL_PROMPTS_PER_STEP}",
    ]


def binomial_band(p_a: float, n_a: int, p_b: float, n_b: int) -> float:
    """Half-width of the 95% band of p_a - p_b, two independent binomial means."""
    return 1.96 * math.sqrt(p_a * (1 - p_a) / n_a + p_b * (1 - p_b) / n_b)


def family_summary(curves: list[dict[str, dict[int, float]]], num_episodes: int) -> dict:
    """Means over seeds of start, RL end and SFT end pass@1; the band of a difference of
    two means (`num_episodes` eval episodes per seed); whether RL held against both."""
    last = max(curves[0]["rl"])
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    start = mean([c["rl"][0] for c in curves])
    rl_end = mean([c["rl"][last] for c in curves])
    sft_end = mean([c["sft"][last] for c in curves])
    n = num_episodes * len(curves)
    band = max(binomial_band(rl_end, n, start, n), binomial_band(rl_end, n, sft_end, n))
    return {
        "start": start,
        "rl_end": rl_end,
        "sft_end": sft_end,
        "band": band,
        "rl_above_start": rl_end - start > band,
        "rl_above_sft": rl_end - sft_end > band,
        "held": rl_end - start > band and rl_end - sft_end > band,
        "seeds_rl_above_sft": sum(c["rl"][last] > c["sft"][last] for c in curves),
    }


# -- plumbing ------------------------------------------------------------------------------


def train_family_seed(
    name: str,
    seed: int,
    work: Path,
    *,
    steps: int,
    snap: int,
    rl_lr: float = RL_LR,
    rl_overrides_extra: tuple[str, ...] = (),
) -> dict:
    """Rows, warm start, RL run and SFT control of one family and seed: the checkpoint
    directories to evaluate by step, and seconds spent."""
    from bench.tether_run import watch_run
    from demo.data import read_jsonl, write_jsonl
    from demo.warmstart import WarmStartRecipe, warm_start

    family, root = FAMILIES[name], work / name / f"seed{seed}"
    started = time.monotonic()
    for draw, size, out in ((seed, NUM_ROWS, "data"), (EVAL_SEED + seed, NUM_EVAL_ROWS, "eval")):
        subprocess.run(prepare_command(family, seed=draw, size=size, out_dir=root / out),
                       check=True, cwd=REPO, stdout=subprocess.DEVNULL)  # fmt: skip
    eval_rows = read_jsonl(root / "eval" / "train.jsonl")
    write_jsonl(root / "data" / "eval_bench.jsonl", eval_rows)
    train_rows = read_jsonl(root / "data" / "train.jsonl")
    warm = warm_start(train_rows, root / "warm", WarmStartRecipe(stop_at=STOP_AT, seed=seed))
    warm_s = time.monotonic() - started
    print(f"{name} seed {seed}: warm start {warm['steps']} steps, {warm_s:.0f} s", flush=True)

    (root / "rl").mkdir(parents=True, exist_ok=True)
    overrides = rl_overrides(family, data_dir=root / "data", model_dir=root / "warm",
                             steps=steps, snapshot_every=snap, lr=rl_lr)  # fmt: skip
    run = watch_run([*overrides, *rl_overrides_extra], root / "rl", keep_snapshots=True)
    rl_dirs = {version: kept for version, _, kept in run.snapshots}
    print(f"{name} seed {seed}: RL {steps} steps, {run.wall_s:.0f} s", flush=True)

    sft_started = time.monotonic()
    # The warm start's own solved rows (same fraction, same seed: the same subset), continued.
    control = WarmStartRecipe(init=str(root / "warm"), fraction=CONTROL_FRACTION, max_steps=steps,
                              stop_at=None, lr=SFT_LR, warmup_steps=steps // 3, seed=seed,
                              check_every=steps)  # fmt: skip
    warm_start(train_rows, root / "sft", control, snapshot_every=snap)
    sft_s = time.monotonic() - sft_started
    sft_dirs = {k: root / "sft" / "steps" / str(k) for k in range(snap, steps + 1, snap)}
    return {
        "warm": root / "warm",
        "eval_rows": eval_rows,
        "rl": {0: root / "warm", **{v: d for v, d in rl_dirs.items() if v % snap == 0}},
        "sft": {0: root / "warm", **sft_dirs},
        "warm_s": warm_s,
        "rl_s": run.wall_s,
        "sft_s": sft_s,
        "warm_steps": warm["steps"],
    }


async def evaluate(trained: dict[tuple[str, int], dict]) -> dict[tuple[str, int], dict]:
    """pass@1 of every checkpoint, by (family, seed) -> {"rl"|"sft": {step: pass@1}}."""
    from bench.pass_at_1 import Evaluator
    from envservers.adapters.reasoning_gym import build_provider

    providers = {f"reasoning_gym:{FAMILIES[name].task}": build_provider(FAMILIES[name].task)
                 for name, _ in trained}  # fmt: skip
    first = next(iter(trained.values()))["warm"]
    evaluator = await Evaluator.start(first, providers=providers)
    curves: dict[tuple[str, int], dict] = {}
    try:
        for key, run in trained.items():
            rows, start = run["eval_rows"], None
            curve: dict[str, dict[int, float]] = {"rl": {}, "sft": {}}
            for arm in ("rl", "sft"):
                for step, weights in sorted(run[arm].items()):
                    if step == 0 and start is not None:
                        curve[arm][0] = start
                        continue
                    pass1 = await evaluator.pass_at_1(rows, weights=weights, samples=EVAL_SAMPLES)
                    curve[arm][step] = pass1
                    start = pass1 if step == 0 else start
            print(f"{key}: {curve}", flush=True)
            curves[key] = curve
    finally:
        evaluator.shutdown()
    return curves


def plot(curves: dict[tuple[str, int], dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({name for name, _ in curves})
    figure, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 3.6), squeeze=False)
    for axis, name in zip(axes[0], names, strict=True):
        for (family, seed), curve in sorted(curves.items()):
            if family != name:
                continue
            for arm, color in (("rl", "tab:blue"), ("sft", "tab:orange")):
                steps = sorted(curve[arm])
                axis.plot(steps, [curve[arm][s] for s in steps], color=color, marker="o",
                          alpha=0.8, label=f"{arm.upper()}" if seed == 0 else None)  # fmt: skip
        axis.set(title=name, xlabel="step", ylabel="eval pass@1", ylim=(0, 1))
        axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=30, help="RL and SFT steps")
    parser.add_argument("--snapshot-every", type=int, default=10)
    parser.add_argument("--rl-lr", type=float, default=RL_LR, help="RL's learning rate")
    parser.add_argument(
        "--rl-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override of the RL runs (configs/demo.toml keys)",
    )
    parser.add_argument("--work-dir", type=Path, help="keep everything here (default: temp)")
    args = parser.parse_args()
    names, seeds = args.families.split(","), [int(s) for s in args.seeds.split(",")]
    for name in names:
        if name not in FAMILIES:
            parser.error(f"unknown family {name!r} (known: {', '.join(FAMILIES)})")

    figures: dict[str, float | int | str] = {
        "steps": args.steps,
        "seeds": args.seeds,
        "stop_at": STOP_AT,
        "rl_lr": args.rl_lr,
        "rl_prompts_per_step": RL_PROMPTS_PER_STEP,
        "rl_overrides": " ".join(args.rl_override),
        "sft_lr": SFT_LR,
    }
    with load_average() as loads, tempfile.TemporaryDirectory(prefix="bench-tasks-") as tmp:
        work = args.work_dir or Path(tmp)
        trained = {(name, seed): train_family_seed(name, seed, work, steps=args.steps,
                                                   snap=args.snapshot_every, rl_lr=args.rl_lr,
                                                   rl_overrides_extra=tuple(args.rl_override))
                   for name in names for seed in seeds}  # fmt: skip
        curves = asyncio.run(evaluate(trained))
    plot(curves, PLOT)
    summaries, seconds = {}, {}
    for name in names:
        family_curves = [curves[(name, seed)] for seed in seeds]
        summaries[name] = family_summary(family_curves, NUM_EVAL_ROWS * EVAL_SAMPLES)
        runs = [trained[(name, seed)] for seed in seeds]
        seconds[name] = sum(r["warm_s"] + r["rl_s"] + r["sft_s"] for r in runs)
        figures.update({f"{name}_{k}": v for k, v in summaries[name].items()})
        figures[f"{name}_seconds"] = seconds[name]
        for seed, run, curve in zip(seeds, runs, family_curves, strict=True):
            for arm in ("rl", "sft"):
                for step, value in curve[arm].items():
                    figures[f"{name}_seed{seed}_{arm}_{step}"] = value
            for key in ("warm_s", "rl_s", "sft_s", "warm_steps"):
                figures[f"{name}_seed{seed}_{key}"] = run[key]
    figures.update(loads)
    print("\n" + render_tasks(figures))
    report("tasks", "RL against plain SFT on reasoning-gym families", figures)


if __name__ == "__main__":
    main()
