"""Peer benchmark: Tether's `make run` against Hugging Face TRL's GRPOTrainer on
the same model, task and machine, one after the other: eval pass@1 against wall time from
launch, and the time each takes to reach a target pass@1 (0.8 by default).

    TRL:    bench/peer_trl_worker.py in TRL's own virtual environment (made on first use:
            `pip install torch==2.13.0 trl==1.16.0`; $TETHER_CACHE/trl-venv or
            .cache/trl-venv), GRPOTrainer in its tools mode with the calculator's `add`
            as the tool (the prompt is checked to render byte for byte as the env server's
            spec), the env's answer rule as the reward, the shipped warm-started tiny
            model, the training rows in the order Tether's dispatcher releases them; a
            checkpoint every `--save-every` steps.
    Tether: `python -m deploy.local` with configs/demo.toml as `make run` runs it; set on
            the command line: the run directory, the step count, and the learner's
            `snapshot_interval` = `--save-every` (the demo writes one every 5 steps;
            1.3 MB of safetensors, milliseconds) so both sides are scored as often. The
            snapshots are kept as they appear (bench/tether_run.py).
    Eval:   afterwards, every checkpoint of both sides and the shared start are scored by
            one evaluator (bench/pass_at_1.py: the rollout code on one vLLM engine, the real
            calculator env, the 100 held-out prompts x 2 seeded samples of the demo's eval
            set). A checkpoint's time is when its weights file was written, from the
            launch of its side's process. Tether's own in-run evals are reported too.

Both sides: 8 prompts x 8 samples per step, lr 1e-4 constant, AdamW (0.9, 0.999), grad
clip 1, temperature 1, up to 3 assistant turns of 64 tokens, GRPO with std-normalised
advantages, token-mean loss, no KL, fp32. What TRL cannot match: see docs/benchmarks.md.

Writes bench/results/peer_trl.json: `trl_time_to_pass1_0p8_s`, `tether_time_to_pass1_0p8_s`,
`ratio` (Tether's / TRL's; the target is <= 0.5), pass@1 and time of every checkpoint, and
where each side's step time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Benchmark, load_average, print_table, write_results
from bench.peer_breakdown import tether_breakdown, trl_breakdown

BENCHMARK = Benchmark(
    measures="Tether's `make run` against TRL's GRPOTrainer on the same task",
    target="bench",
    minutes=8.5,
)

REPO = Path(__file__).resolve().parents[1]
TRL_PACKAGES = ("torch==2.13.0", "trl==1.16.0")


def trl_venv_dir() -> Path:
    cache = os.environ.get("TETHER_CACHE")
    return (Path(cache) if cache else REPO / ".cache") / "trl-venv"


def ensure_trl_venv(venv: Path) -> Path:
    """TRL's own virtual environment (created and installed once; a stamp names the
    packages); returns its python."""
    python = venv / "bin" / "python"
    stamp = venv / ".tether-installed"
    if stamp.is_file() and stamp.read_text() == " ".join(TRL_PACKAGES):
        return python
    print(f"installing {' '.join(TRL_PACKAGES)} into {venv} (once; minutes) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # torch first: the CPU build, so that trl does not pull a CUDA one (as deploy/install.sh).
    for package in TRL_PACKAGES:
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", package], check=True)
    stamp.write_text(" ".join(TRL_PACKAGES))
    return python


def training_rows(num_rows: int = 10_000, seed: int = 0) -> list[dict]:
    """The demo's training rows (deploy.local's dataset) in the order Tether's dispatcher
    releases them, so step k of either side trains on the same 8 prompts."""
    from demo.data import make_rows
    from learner.dispatcher import dataset_order

    rows = make_rows(num_rows, seed=seed, split="train")
    return [rows[i] for i in dataset_order(len(rows), 0, seed)]


def run_trl(python: Path, work: Path, args) -> dict:
    """TRL's training run; returns its progress records, checkpoints and wall time, all in
    seconds from the launch of its process."""
    from demo.data import write_jsonl

    needed = args.steps * args.prompts_per_step
    train = write_jsonl(work / "trl_train.jsonl", training_rows()[:needed])
    out = work / "trl"
    command = [
        str(python),
        *("-m", "bench.peer_trl_worker"),  # from REPO (cwd and PYTHONPATH below)
        *("--model", str(args.model), "--train", str(train), "--out", str(out)),
        *("--steps", str(args.steps), "--save-every", str(args.save_every)),
        *("--threads", str(args.trl_threads)),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with (work / "trl.log").open("w") as log:
        started = time.time()
        code = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=log).returncode
        wall_s = time.time() - started
    if code != 0:
        raise RuntimeError(f"TRL exited with {code}:\n{(work / 'trl.log').read_text()[-3000:]}")
    records = [json.loads(line) for line in (out / "progress.jsonl").read_text().splitlines()]
    for record in records:
        record["t"] -= started
    checkpoints = [
        (r["step"], (Path(r["path"]) / "model.safetensors").stat().st_mtime - started, r["path"])
        for r in records
        if r["kind"] == "checkpoint"
    ]
    return {"records": records, "checkpoints": checkpoints, "wall_s": wall_s}


def run_tether(work: Path, args):
    from bench.tether_run import watch_run

    overrides = [
        f"learner.total_steps={args.steps}",
        f"learner.snapshot_interval={args.save_every}",
        *args.tether_override,
    ]
    return watch_run(overrides, work, keep_snapshots=True)


async def score_checkpoints(model: Path, trl: dict, tether, args) -> dict[str, float]:
    """pass@1 of the start and of every checkpoint of both sides, one evaluator."""
    from bench.pass_at_1 import Evaluator
    from demo.data import eval_rows

    rows = eval_rows(args.eval_prompts)
    evaluator = await Evaluator.start(model, cpu_core=args.eval_core)
    try:
        scores = {"start": await evaluator.pass_at_1(rows, samples=args.eval_samples)}
        for step, _, path in trl["checkpoints"]:
            scores[f"trl_{step}"] = await evaluator.pass_at_1(
                rows, weights=path, samples=args.eval_samples
            )
        for version, _, path in tether.snapshots:
            scores[f"tether_{version}"] = await evaluator.pass_at_1(
                rows, weights=path, samples=args.eval_samples
            )
    finally:
        evaluator.shutdown()
    return scores


def time_to_target(points: list[tuple[float, float]], target: float) -> float | None:
    """The first time (points in time order) at which pass@1 reached `target`; None if never."""
    return next((t for t, score in sorted(points) if score >= target), None)


def curves(scores: dict, trl: dict, tether) -> dict[str, list[tuple[int, float, float]]]:
    """(step, seconds from launch, pass@1) per side; step 0 is the shared start at t = 0."""
    start = [(0, 0.0, scores["start"])]
    return {
        "trl": start + [(s, t, scores[f"trl_{s}"]) for s, t, _ in trl["checkpoints"]],
        "tether": start + [(v, t, scores[f"tether_{v}"]) for v, t, _ in tether.snapshots],
    }


def figures_of(args, scores, trl, tether, loads) -> dict:
    key = f"time_to_pass1_{args.target:g}".replace(".", "p") + "_s"
    curve = curves(scores, trl, tether)
    figures: dict = {}
    for side in ("trl", "tether"):
        figures[f"{side}_{key}"] = time_to_target([(t, p) for _, t, p in curve[side]], args.target)
        for step, t, score in curve[side][1:]:
            figures[f"{side}_pass1_step{step:02d}"] = score
            figures[f"{side}_t_step{step:02d}_s"] = t
    ours, theirs = figures[f"tether_{key}"], figures[f"trl_{key}"]
    figures["ratio"] = ours / theirs if ours is not None and theirs else None
    figures["target_pass1"] = args.target
    figures["pass1_start"] = scores["start"]
    figures.update(trl_breakdown(trl))
    figures.update(tether_breakdown(tether))
    for side in ("trl", "tether"):  # the same, counted from the end of start-up
        reached, startup = figures[f"{side}_{key}"], figures.get(f"{side}_startup_s")
        after = key[: -len("_s")] + "_after_startup_s"
        figures[f"{side}_{after}"] = reached - startup if None not in (reached, startup) else None
    for record in tether.evals:
        figures[f"tether_inrun_pass1_v{record['version']:02d}"] = record["pass_at_1"]
    figures.update(
        steps=args.steps,
        eval_prompts=args.eval_prompts,
        eval_samples=args.eval_samples,
        trl_torch_threads=args.trl_threads,
        **loads,
    )
    return figures


def show(figures: dict, args) -> None:
    key = f"time_to_pass1_{args.target:g}".replace(".", "p") + "_s"
    rows = [("pass@1 at the start (shared)", figures["pass1_start"])]
    for side in ("trl", "tether"):
        steps = sorted(k for k in figures if k.startswith(f"{side}_pass1_step"))
        rows += [
            (f"{side} {k[len(side) + 7 :]}: pass@1 / s from launch", _pair(figures, k))
            for k in steps
        ]
        rows.append((f"{side} seconds to pass@1 >= {args.target}", figures[f"{side}_{key}"]))
    rows += [(name, figures[name]) for name in sorted(figures) if name.endswith("_per_step_s")]
    rows.append(("ratio (Tether / TRL; target <= 0.5)", figures["ratio"]))
    print_table("peer: Tether `make run` vs TRL GRPOTrainer, same task and machine", rows)


def _pair(figures: dict, pass_key: str) -> str:
    t = figures[pass_key.replace("_pass1_", "_t_") + "_s"]
    return f"{figures[pass_key]:.3f} / {t:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps, both sides")
    parser.add_argument("--target", type=float, default=0.8, help="pass@1 to reach")
    parser.add_argument("--save-every", type=int, default=2, help="checkpoint interval, both sides")
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--eval-prompts", type=int, default=100)
    parser.add_argument("--eval-samples", type=int, default=2)
    parser.add_argument("--eval-core", default="1", help="the evaluator engine's core")
    parser.add_argument(
        "--trl-threads",
        type=int,
        default=2,
        help="TRL's torch threads: 2 as the first peer run had it; on a busy shared machine use "
        "1 (two OpenMP threads there took 35-120 s per step against 6-9 s for one)",
    )
    parser.add_argument("--model", type=Path, default=REPO / "demo" / "tiny_model")
    parser.add_argument(
        "--tether-override", action="append", default=[], help="extra section.key=value"
    )
    parser.add_argument("--work-dir", type=Path, help="keep the runs here (default: temp)")
    args = parser.parse_args()

    python = ensure_trl_venv(trl_venv_dir())
    with tempfile.TemporaryDirectory(prefix="peer-trl-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        with load_average() as loads:
            print("TRL GRPOTrainer ...", flush=True)
            trl = run_trl(python, work, args)
            print(f"  {trl['wall_s']:.0f} s; Tether `make run` ...", flush=True)
            tether = run_tether(work, args)
        if not tether.snapshots or not trl["checkpoints"]:  # nothing to score: no ratio
            raise RuntimeError(
                f"checkpoints to score: TRL {len(trl['checkpoints'])}, Tether "
                f"{len(tether.snapshots)} (exit {tether.returncode}; logs in {work})"
            )
        print(f"  {tether.wall_s:.0f} s; scoring every checkpoint ...", flush=True)
        scores = asyncio.run(score_checkpoints(args.model, trl, tether, args))
        figures = figures_of(args, scores, trl, tether, loads)
    show(figures, args)
    write_results("peer_trl", figures)


if __name__ == "__main__":
    main()
