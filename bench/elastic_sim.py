"""An elastic fleet planned past this machine: deploy/fleet_sim.py's simulator,
calibrated with what was measured here, plans a fleet of up to 64 replicas under the agentic
workload with a load step (every tool call 10x slower for ten minutes mid-run), and compares
the elastic fleet with fixed fleets at its bounds (64, and 1). A model, not a measurement:
every input below is read from the file it was measured into, never typed twice.

    one replica's generation  bench/results/actor.json: actor_tokens_per_s with max_num_seqs
                              sequences decoding (bench/actor.py, engine full), its
                              mean_tokens_per_request (a turn) and requests / episodes (turns
                              per episode), and engine_startup_s (a new replica's start)
    tool latency              bench/results/agentic.json: the agentic workload's median and
                              p99 (log-normal), capped at the env server's step_timeout_s
    a learner step            bench/results/agentic.json: train_s + broadcast_s per step at
                              the recommended bound (4, TIS) with configs/demo.toml's
                              prompts_per_step, scaled to this plan's prompts per step
    group size                configs/demo.toml (the run agentic.json measured)

The plan's own choices: 128 prompts a step at bound 4 (a window of 640 groups: enough to
keep more than 64 replicas of 8 groups busy, so the 64 ceiling binds), 200 steps, the
load step from minute 10 to minute 20, `[elastic]`'s defaults for its windows and poll.

    python -m bench.elastic_sim            (about a minute on 2 cores; part of `make bench`)

Writes bench/results/elastic_sim.json and docs/images/elastic_sim.png, prints the table.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

from bench.common import RESULTS_DIR, Benchmark, print_table, write_results
from bench.render.agentic import DEFAULT_BOUND
from common.fleet import ElasticConfig
from deploy.fleet_sim import compare, summary_table
from deploy.fleet_sim_model import Learner, Result, Workload
from envservers.config import EnvServerConfig
from envservers.latency import LoadStep

BENCHMARK = Benchmark(
    measures="an elastic fleet planned past this machine (deploy/fleet_sim.py's simulator)",
    target="bench",
    minutes=0.5,
)

REPO = Path(__file__).resolve().parents[1]
PLOT = REPO / "docs" / "images" / "elastic_sim.png"
DEMO_CONFIG = REPO / "configs" / "demo.toml"
MAX_REPLICAS, PROMPTS_PER_STEP, STEPS = 64, 128, 200
LOAD_FACTOR, LOAD_FROM_S, LOAD_FOR_S = 10.0, 600.0, 600.0
FLEETS = {"elastic": "elastic 1-64", "fixed_max": "fixed 64", "fixed_min": "fixed 1"}
"""Results keys by fleet label."""


def calibration(results_dir: Path) -> dict[str, float | str]:
    """The simulator's inputs measured here, by name, with when they were measured."""
    actor = json.loads((results_dir / "actor.json").read_text())
    agentic = json.loads((results_dir / "agentic.json").read_text())
    demo = tomllib.loads(DEMO_CONFIG.read_text())["learner"]
    mode = f"agentic_b{DEFAULT_BOUND}"
    step_s = agentic[f"{mode}_train_s_per_step"] + agentic[f"{mode}_broadcast_s_per_step"]
    return {
        "replica_tokens_per_s": actor["actor_tokens_per_s"],
        "engine_slots": actor["max_num_seqs"],
        "tokens_per_turn": actor["mean_tokens_per_request"],
        "turns_per_episode": actor["requests"] / actor["episodes"],
        "engine_start_s": actor["engine_startup_s"],
        "tool_median_s": agentic["agentic_tool_median_ms"] / 1000,
        "tool_p99_s": agentic["agentic_tool_p99_s"],
        "tool_timeout_s": EnvServerConfig.model_fields["step_timeout_s"].default,
        "measured_train_s_per_step": step_s,
        "measured_prompts_per_step": demo["prompts_per_step"],
        "train_s_per_step": step_s * PROMPTS_PER_STEP / demo["prompts_per_step"],
        "group_size": demo["group_size"],
        "max_staleness": DEFAULT_BOUND,
        "actor_measured_at": actor["measured_at"],
        "agentic_measured_at": agentic["measured_at"],
    }


def plan(c: dict, *, seed: int) -> dict[str, Result]:
    workload = Workload(
        turns_per_episode=c["turns_per_episode"],
        tokens_per_turn=c["tokens_per_turn"],
        replica_tokens_per_s=c["replica_tokens_per_s"],
        engine_slots=c["engine_slots"],
        tool_median_s=c["tool_median_s"],
        tool_p99_s=c["tool_p99_s"],
        load_step=LoadStep(LOAD_FACTOR, LOAD_FROM_S, LOAD_FOR_S),
        tool_timeout_s=c["tool_timeout_s"],
    )
    learner = Learner(
        train_s_per_step=c["train_s_per_step"],
        prompts_per_step=PROMPTS_PER_STEP,
        group_size=c["group_size"],
        max_staleness=c["max_staleness"],
        total_steps=STEPS,
    )
    elastic = ElasticConfig(
        enabled=True, max_replicas=MAX_REPLICAS, engine_start_s=c["engine_start_s"]
    )
    return compare(workload, learner, elastic, engine_start_s=c["engine_start_s"], seed=seed)


def figures_of(results: dict[str, Result]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, label in FLEETS.items():
        s = results[label].summary
        out |= {
            f"{key}_replicas_min": s.fewest_replicas,
            f"{key}_replicas_max": s.peak_replicas,
            f"{key}_replicas_end": results[label].samples[-1].replicas,
            f"{key}_run_s": s.run_s,
            f"{key}_learner_idle_frac": s.learner_idle_frac,
            f"{key}_learner_idle_frac_during_step": s.learner_idle_frac_during_step,
            f"{key}_replica_hours": s.replica_hours,
            f"{key}_handbacks": s.handbacks,
            f"{key}_groups_dropped_stale": s.groups_dropped_stale,
            f"{key}_window_peak": s.window_peak,
        }
    return out


def plot(results: dict[str, Result], path: Path, smooth_s: float = 60.0) -> None:
    """Replicas, the backlog the rule reads, and the learner's idle share (over `smooth_s`)
    against time, every fleet; the load step shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end_s = results[FLEETS["elastic"]].summary.run_s * 1.15
    figure, axes = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True)
    for label, result in results.items():
        samples = [s for s in result.samples if s.t <= end_s]
        minutes = [s.t / 60 for s in samples]
        width = max(1, round(smooth_s / (samples[1].t - samples[0].t)))
        smoothed = _trailing_mean([s.learner_idle_frac for s in samples], width)
        axes[0].plot(minutes, [s.replicas for s in samples], label=label)
        axes[1].plot(minutes, [s.work for s in samples], label=label)
        axes[2].plot(minutes, smoothed, label=label)
    titles = ("replicas (started or ready)", "work: groups released, not finished",
              f"learner idle (share of the last {smooth_s:.0f} s)")  # fmt: skip
    for axis, title in zip(axes, titles, strict=True):
        axis.axvspan(LOAD_FROM_S / 60, (LOAD_FROM_S + LOAD_FOR_S) / 60, color="0.9")
        axis.set(title=title)
        axis.legend(loc="upper right", fontsize="small")
    axes[-1].set(xlabel=f"minutes (shaded: tool latency x{LOAD_FACTOR:g})", ylim=(0, 1.05))
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)


def _trailing_mean(values: list[float], width: int) -> list[float]:
    """Each value's mean with the `width - 1` before it (fewer at the start)."""
    return [
        sum(window) / len(window)
        for window in (values[max(0, i - width + 1) : i + 1] for i in range(len(values)))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="calibration files")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    c = calibration(args.results)
    print_table("calibration (measured here)", [(k, v) for k, v in c.items()])
    results = plan(c, seed=args.seed)
    print("\n" + summary_table([result.summary for result in results.values()]))
    plot(results, PLOT)
    print(f"wrote {PLOT}")
    figures = {f"calib_{k}": v for k, v in c.items()} | figures_of(results)
    figures |= {"max_replicas": MAX_REPLICAS, "prompts_per_step": PROMPTS_PER_STEP}
    figures |= {"steps": STEPS, "seed": args.seed, "load_factor": LOAD_FACTOR}
    figures |= {"load_from_s": LOAD_FROM_S, "load_for_s": LOAD_FOR_S}
    write_results("elastic_sim", figures)


if __name__ == "__main__":
    main()
