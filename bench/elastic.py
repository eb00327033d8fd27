"""An elastic actor fleet against a fixed single replica, on a real Ray cluster of three
simulated nodes on this machine (deploy/ray_testbed.py), under a load step: every tool call
of the calculator waits ~0.1 s, twenty times that for two minutes mid-run (envservers/latency.py).

    python -m bench.elastic [--steps 150]      two runs, ~15 min on 2 cores

Both runs are `make cluster-up TARGET=ray` with the same steps and workload; the elastic one
has `[elastic]` on (1 to 2 replicas: the staleness window of 8 groups over 4 per replica),
the fixed one keeps its one replica. Per run: the fleet's size over time (the supervisor's
`scaled` events), the learner's idle fraction (its data waits over its wall time) during
the load step and overall, the run's length, whether its books balance
(deploy/run_ledger.py), and the groups leaving replicas handed back at a turn boundary
against those cut at the end of their grace (a cut group's episodes are played again; a
handed-back one's continue from their last turn, so none cut = no token generated twice).

Writes bench/results/elastic.json and docs/images/elastic.png, and prints the table;
`--report DIR` redoes them from runs kept with `--keep DIR`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Benchmark, load_average, report
from common.supervision import read_events
from deploy.ray_testbed import FITS_THE_TESTBED, GPU_NODE, HEAD, local_cluster
from deploy.run_ledger import RunLedger, read_jsonl

BENCHMARK = Benchmark(
    measures="an elastic fleet against one replica on a 3-node local Ray cluster",
    target="by hand",
    minutes=12,
)

REPO = Path(__file__).resolve().parents[1]
IMAGE = REPO / "docs" / "images" / "elastic.png"
NAMESPACE = "tether-bench"
STEP_FACTOR, STEP_AFTER_S, STEP_FOR_S = 20.0, 30.0, 120.0
TOOL_MEDIAN_S = 0.3

WORKLOAD = [
    "prepare.num_train_rows=512",
    "prepare.num_eval_rows=8",
    "learner.max_staleness=1",
    "learner.prompts_per_step=4",
    "learner.group_size=4",
    "learner.eval_samples_per_prompt=1",
    "learner.drain_timeout_s=10",
    "learner.snapshot_interval=1",
    # Small micro-batches make the learner's step the slower side before the load step, as
    # a big model's would: one replica keeps up until the tools slow down.
    "learner.micro_batch_tokens=32",  # a replica that joins starts from a recent version
    "actor.engine.max_num_seqs=16",  # 4 groups of 4 at once: 2 replicas fill the window
    # and no more while tools run, as a GPU engine's KV cache holds a replica to its room:
    # uncapped, one replica would hold every released group while they wait on tools.
    "actor.max_groups_in_flight=4",
    "actor.rollout.max_generate_length=32",
    "actor.drain_timeout_s=20",
    f"envserver.calculator.latency_median_s={TOOL_MEDIAN_S}",
    "envserver.calculator.latency_p99_s=0.8",
    "envserver.calculator.latency_seed=0",
    f"envserver.calculator.load_step_factor={STEP_FACTOR}",
    f"envserver.calculator.load_step_after_s={STEP_AFTER_S}",
    f"envserver.calculator.load_step_for_s={STEP_FOR_S}",
    "broker.prompt_ack_wait_s=15",
    "actor.heartbeat_s=3",
    "ray.actor_replicas=1",
    "ray.envservers=1",
    *FITS_THE_TESTBED,
    "ray.bind_host=127.0.0.1",
    f"ray.namespace={NAMESPACE}",
]
ELASTIC = [
    "elastic.enabled=true",
    "elastic.scale_up_after_s=15",
    "elastic.scale_down_after_s=60",
    "elastic.engine_start_s=60",  # an engine's start here, loaded (46 s measured)
    "elastic.poll_s=2",
]
_STEP_LINE = re.compile(r"load step: tool latency x([\d.]+) from unix time ([\d.]+)")
_LEAVE_LINE = re.compile(r"leaving: (\d+) groups handed back .*?, (\d+) cut")


def cluster_run(overrides: list[str], runs_dir: Path, timeout_s: float) -> Path:
    """One run through the Makefile's entry point, followed to its end; then `down`."""
    log = runs_dir / "up.log"
    argv = [sys.executable, "-m", "deploy.cluster", "up", "--target=ray", "--"]
    with open(log, "w") as out:
        code = subprocess.call(
            [*argv, *overrides, f"ray.runs_dir={runs_dir}"],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
        )  # fmt: skip
    subprocess.call(
        [sys.executable, "-m", "deploy.ray_cluster", "down", f"ray.namespace={NAMESPACE}"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=300,
    )  # fmt: skip
    if code != 0:
        raise RuntimeError(f"the run failed ({code}):\n{log.read_text()[-4000:]}")
    return (runs_dir / "latest").resolve()


def load_step_window(run_dir: Path) -> tuple[float, float]:
    """The load step's (start, end) in unix time, as the env server logged it."""
    text = (run_dir / "logs" / "envserver-0.log").read_text()
    changes = [(float(factor), float(at)) for factor, at in _STEP_LINE.findall(text)]
    starts = [at for factor, at in changes if factor != 1.0]
    ends = [at for factor, at in changes if factor == 1.0 and starts and at > starts[0]]
    if not starts:
        raise RuntimeError(f"{run_dir}: the env server never logged its load step")
    return starts[0], ends[0] if ends else float("inf")


def idle_fraction(train: list[dict], start: float, end: float) -> float:
    """The learner's data waits over its wall time, for the steps that ended in [start,
    end] (each step's wait and wall: since the previous step ended)."""
    waited = wall = 0.0
    for before, step in zip(train, train[1:], strict=False):
        if start <= step["time"] <= end:
            waited += step["wait_data_s"]
            wall += step["wall_s"] - before["wall_s"]
    return waited / wall if wall else float("nan")


def fleet_sizes(events: list[dict]) -> list[tuple[float, int]]:
    """(unix time, replicas) at the start and at every scale event of a run's events."""
    sizes = [(e["time"], e["replicas"]) for e in events if e["event"] == "scaled"]
    start = next(e["time"] for e in events if e["event"] == "running")
    return [(start, 1), *sizes]


def leaves(run_dir: Path) -> tuple[int, int]:
    """(groups handed back, groups cut) over every replica that left."""
    handed = cut = 0
    for log in (run_dir / "logs").glob("actor-*.log"):
        for back, lost in _LEAVE_LINE.findall(log.read_text()):
            handed, cut = handed + int(back), cut + int(lost)
    return handed, cut


def run_figures(run_dir: Path, prefix: str) -> dict[str, float | str]:
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    start, end = load_step_window(run_dir)
    events = read_events(run_dir)
    sizes = fleet_sizes(events)
    handed, cut = leaves(run_dir)
    broadcasts = sorted(r["broadcast_s"] for r in train)
    began = sizes[0][0]
    return {
        f"{prefix}_steps": len(train),
        f"{prefix}_run_s": train[-1]["wall_s"],
        f"{prefix}_idle_before_step": idle_fraction(train, 0.0, start),
        f"{prefix}_idle_during_step": idle_fraction(train, start, end),
        f"{prefix}_idle_after_step": idle_fraction(train, end, float("inf")),
        f"{prefix}_idle_overall": idle_fraction(train, 0.0, float("inf")),
        f"{prefix}_steps_in_step": sum(start <= r["time"] <= end for r in train),
        f"{prefix}_max_replicas": max(n for _, n in sizes),
        f"{prefix}_final_replicas": sizes[-1][1],
        f"{prefix}_fleet": " ".join(f"{t - began:.0f}s:{n}" for t, n in sizes),
        f"{prefix}_load_step": f"{start - began:.0f}s-{end - began:.0f}s",
        f"{prefix}_scale_events": len(sizes) - 1,
        f"{prefix}_replicas_left": sum(e["event"] == "left" for e in events),
        f"{prefix}_groups_handed_back": handed,
        f"{prefix}_groups_cut": cut,
        # A joiner or a leaver must not stall a round for the others.
        f"{prefix}_broadcast_s_median": broadcasts[len(broadcasts) // 2],
        f"{prefix}_broadcast_s_max": broadcasts[-1],
        f"{prefix}_ledger_problems": len(RunLedger.read(run_dir).problems()),
    }


def plot(run_dirs: dict[str, Path], path: Path) -> None:
    """The fleet's size and the learner's idle share per step, both runs, load step shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    for name, run_dir in run_dirs.items():
        sizes = fleet_sizes(read_events(run_dir))
        began = sizes[0][0]
        train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
        xs = [t - began for t, _ in sizes] + [train[-1]["time"] - began]
        top.step(xs, [n for _, n in sizes] + [sizes[-1][1]], where="post", label=name)
        pairs = list(zip(train, train[1:], strict=False))
        idle = [b["wait_data_s"] / max(b["wall_s"] - a["wall_s"], 1e-9) for a, b in pairs]
        bottom.plot([b["time"] - began for _, b in pairs], idle, ".", ms=3, label=name)
        start, end = load_step_window(run_dir)
        for axis in (top, bottom):
            axis.axvspan(start - began, end - began, color="0.9", zorder=0)
    top.set_ylabel("replicas")
    top.legend(loc="upper right", fontsize=8)
    bottom.set_ylabel("learner idle\n(share of a step)")
    bottom.set_xlabel(f"seconds since the run started (shaded: tool latency x{STEP_FACTOR:g})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


def run_both(steps: int, only: str | None, runs: Path) -> dict[str, Path]:
    """Each run in `runs/<name>`, on one local cluster; their run directories."""
    overrides = [f"learner.total_steps={steps}", f"learner.eval_interval={steps}"]
    out = {}
    with local_cluster([HEAD, GPU_NODE, GPU_NODE]):
        for name, extra in (("fixed", []), ("elastic", ELASTIC)):
            if only not in (None, name):
                continue
            runs_dir = runs / name
            runs_dir.mkdir(parents=True)
            started = time.monotonic()
            out[name] = cluster_run(WORKLOAD + overrides + extra, runs_dir, timeout_s=1800)
            sizes = json.dumps(fleet_sizes(read_events(out[name])))
            print(f"{name}: {time.monotonic() - started:.0f} s; fleet {sizes}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--only", choices=("fixed", "elastic"), default=None)
    parser.add_argument("--keep", type=Path, help="keep the runs here (default: a temporary dir)")
    parser.add_argument("--report", type=Path, help="no runs: the figures of those kept here")
    args = parser.parse_args()
    figures: dict[str, float | str] = {
        "load_step_factor": STEP_FACTOR,
        "load_step_for_s": STEP_FOR_S,
        "tool_median_s": TOOL_MEDIAN_S,
        **{f"elastic_{k.split('.')[1]}": float(v) for k, v in (o.split("=") for o in ELASTIC[1:])},
    }
    with tempfile.TemporaryDirectory() as tmp, load_average() as load:
        if args.report:
            run_dirs = {n: (args.report / n / "latest").resolve() for n in ("fixed", "elastic")}
        else:
            run_dirs = run_both(args.steps, args.only, args.keep or Path(tmp))
        for name, run_dir in run_dirs.items():
            figures.update(run_figures(run_dir, name))
        if len(run_dirs) == 2:
            plot(run_dirs, IMAGE)
    if not args.report:
        figures.update(load)
    if len(run_dirs) == 2:
        figures["idle_during_step_elastic_over_fixed"] = (
            figures["elastic_idle_during_step"] / figures["fixed_idle_during_step"]
        )
    report("elastic", "Elastic fleet vs one fixed replica, load step x20 (Ray, 3 nodes)", figures)


if __name__ == "__main__":
    main()
