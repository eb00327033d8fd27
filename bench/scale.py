"""The scale ladder: the same short real run (`python -m deploy.local`, every role,
3 steps) at random Qwen2 models from 10M parameters to Qwen2-0.5B's shape, all over Qwen's
real 151,643-token BPE vocabulary (demo/qwen_vocab.py), so the head, the wire and the
checkpoints carry what our users' models carry. Per size, each cost divided by what the
machine gives for the same bytes or work, measured in the same run: flat lines as the
model grows mean nothing grows faster than the model.

    learner_vs_bare       the learner's tokens/s over a bare torch loop's (forward, backward,
                          AdamW) on the same tokens in the same micro-batches, one thread
    <role>_rss_x_weights  each role's peak resident memory over the model's fp32 bytes
    learner_rss_vs_bare   the learner's peak over the bare loop's (weights, gradients, AdamW
                          state and activations, nothing else)
    learner_rss_x_state   the learner's peak over its training state (16 bytes a parameter)
    wire_of_loopback      the weight broadcast's bytes/s on the wire (the engines' time
                          waiting for its messages) over one loopback TCP stream's
    broadcast_of_loopback the whole round's bytes/s as the sender saw it (streamed: the
                          engine loads each bucket before it takes the next) over the same
    checkpoint_x_disk     a checkpoint's write seconds over (its bytes / fsynced disk writes)
    checkpoint_wait_s     of that write, the seconds the next step waited (the rest was
                          hidden behind its wait for data: learner/checkpoints.py)
    resume_x_disk         a fresh learner's restore of the last checkpoint (model, AdamW,
                          schedule: what a resume reads; its files evicted from the page
                          cache first) over (its bytes / the disk probe's read from the disk)
    update_stall_s        how long an engine stops generating for one update (seconds)

    make bench-scale        (the four sizes in fp32, then 0.5B in bf16: ~14 min on 2 cores)
    python -m bench.scale --sizes 10M,45M,45M@bf16

Prints a table, writes bench/results/scale.json and bench/results/scale.png.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import (
    RESULTS_DIR,
    Benchmark,
    load_average,
    loopback_bytes_per_s,
    report,
)
from bench.scale_support import (
    RolePeaks,
    bare_loop_tokens_per_s,
    disk_bytes_per_s,
    resume_seconds,
)
from bench.tether_run import watch_run
from common.proc_memory import status_mib
from demo.random_model import LADDER, Shape
from learner.trainer.checkpoint import STATE_FILE

BENCHMARK = Benchmark(
    measures="the same short real run at random models from 10M to 0.5B parameters",
    target="bench-scale",
    minutes=14,
)

STEPS = 3
MICRO_TOKENS = 1024


BF16 = ["actor.engine.dtype=bfloat16", "learner.dtype=bfloat16"]
"""A `<size>@bf16` run: the engine in bf16 (weights travel in it) and the learner computing in
bf16 with fp32 master weights (the learner refuses an engine of another dtype)."""


def run_overrides(model_dir: Path, *, bf16: bool = False) -> list[str]:
    """The probe: 3 steps of 2 prompts x 4 samples, a checkpoint after every step,
    one small eval at the end (on a snapshot of its version)."""
    return (BF16 if bf16 else []) + [
        f"learner.total_steps={STEPS}",
        f"learner.model_path={model_dir}",
        f"actor.engine.model={model_dir}",
        "local.warm_start=false",
        "learner.prompts_per_step=2",
        "learner.group_size=4",
        f"learner.micro_batch_tokens={MICRO_TOKENS}",
        "actor.engine.max_num_seqs=16",
        "learner.checkpoint.interval=1",
        "local.num_eval_rows=8",
        "learner.eval_samples_per_prompt=1",
        f"learner.eval_interval={STEPS}",
        # A random model over 151k tokens almost never samples EOS, so every turn ends at
        # max_generate_length; DAPO's overlong filtering would then mask every token and
        # the learner would train on none. Here the learner's work is the point.
        "actor.rollout.overlong_filtering=false",
    ]


class CheckpointTimes:
    """When each `checkpoints/step_N/` appeared and when its state.json (written last) did:
    the save's wall time as seen from outside, at the poll's resolution."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.finished: dict[str, float] = {}

    def poll(self, run_dir: Path, t: float) -> None:
        root = run_dir / "checkpoints"
        for step in root.glob("step_*") if root.is_dir() else ():
            self.started.setdefault(step.name, t)
            if (step / STATE_FILE).is_file():
                self.finished.setdefault(step.name, t)

    def seconds(self) -> list[float]:
        return [self.finished[n] - self.started[n] for n in self.finished]


def _bare_loop(conn, model_dir: str, step_tokens: int) -> None:
    tokens_per_s = bare_loop_tokens_per_s(
        Path(model_dir), step_tokens=step_tokens, micro_tokens=MICRO_TOKENS
    )
    conn.send((tokens_per_s, int(status_mib("VmHWM") * 2**20)))


def bare_loop(model_dir: Path, step_tokens: int) -> tuple[float, int]:
    """(tokens/s, peak RSS bytes) of the bare loop, in a fresh process of its own."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_bare_loop, args=(child, str(model_dir), step_tokens))
    process.start()
    child.close()  # so a child that dies ends recv() with EOFError instead of a hang
    result = parent.recv()
    process.join()
    return result


def _resume(conn, trainer_json: str, checkpoint: str) -> None:
    conn.send(resume_seconds(trainer_json, Path(checkpoint)))


def resume(overrides: list[str], checkpoint: Path) -> float:
    """`resume_seconds` with the run's learner config, in a fresh process of its own (as a
    restarted learner is)."""
    from common.config import read_sections
    from deploy.local import DEFAULT_CONFIG
    from learner.trainer.config import TrainerConfig

    learner = read_sections(DEFAULT_CONFIG, overrides)["learner"]  # the trainer's part of it
    trainer = TrainerConfig.model_validate(
        {key: value for key, value in learner.items() if key in TrainerConfig.model_fields}
    )
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    args = (child, trainer.model_dump_json(), str(checkpoint))
    process = context.Process(target=_resume, args=args)
    process.start()
    child.close()
    seconds = parent.recv()
    process.join()
    return seconds


def _per_update_stall_s(counters: list[dict[str, float]]) -> float | None:
    """Mean seconds an engine stopped generating for one broadcast round (all replicas)."""
    stall, kind = "tether_actor_weight_update_stall_seconds", '{kind="broadcast"}'
    total = sum(c.get(f"{stall}_sum{kind}", 0.0) for c in counters)
    count = sum(c.get(f"{stall}_count{kind}", 0.0) for c in counters)
    return total / count if count else None  # no round reached an engine


def measure(shape: Shape, model_dir: Path, work: Path, machine: dict, *, bf16: bool) -> dict:
    """One watched run at `shape`, then the bare loop on the run's own step size."""
    peaks, checkpoints = RolePeaks(), CheckpointTimes()

    def on_poll(run, launcher, t: float) -> None:
        peaks.poll(launcher.pid)
        checkpoints.poll(run.run_dir, t)

    overrides = run_overrides(model_dir, bf16=bf16)
    run = watch_run(overrides, work, on_poll=on_poll, poll_s=0.25)
    train = run.train
    if len(train) != STEPS:
        raise RuntimeError(f"{shape.name}: {len(train)} train records, wanted {STEPS}")
    done = next(r for r in run.records if r["kind"] == "done")
    if empty := done["steps_without_loss_tokens"]:
        raise RuntimeError(f"{shape.name}: {empty} steps had no loss token to train on")
    step_tokens = int(statistics.median(r["num_tokens"] for r in train))
    bare_tokens_per_s, bare_peak = bare_loop(model_dir, step_tokens)
    weights = 4 * shape.num_params
    roles = peaks.bytes_by_role()
    # The sender's transfer: forming the round and every bucket into the engine (loaded as
    # it arrives); not the snapshot written from the same stream when one is due.
    broadcast = [r["broadcast_bytes"] / r["broadcast_transfer_s"] for r in train
                 if r.get("broadcast_transfer_s", 0) > 0]  # fmt: skip
    checkpoint_bytes = statistics.median(
        sum(f.stat().st_size for f in step.rglob("*") if f.is_file())
        for step in (run.run_dir / "checkpoints").glob("step_*")
    )
    checkpoint_s = statistics.median(checkpoints.seconds())
    steps = sorted((run.run_dir / "checkpoints").glob("step_*"),
                   key=lambda step: int(step.name.removeprefix("step_")))  # fmt: skip
    resume_s = resume(overrides, steps[-1])
    last_counters = run.actor_samples[-1][1] if run.actor_samples else []
    wire = [sum(c.get(f"tether_actor_weight_{m}_total", 0.0) for c in last_counters)
            for m in ("update_bytes", "wire_seconds")]  # fmt: skip
    figures = {
        "params": shape.num_params,
        "weights_gb": weights / 1e9,
        "wall_s": run.wall_s,
        "step_tokens": step_tokens,
        "learner_tokens_per_s": statistics.median(r["tokens_per_s"] for r in train),
        "bare_tokens_per_s": bare_tokens_per_s,
        "bare_peak_gb": bare_peak / 1e9,
        "broadcast_mb_per_s": statistics.median(broadcast) / 1e6,
        "broadcast_wire_mb_per_s": wire[0] / wire[1] / 1e6 if wire[1] else float("nan"),
        "checkpoint_gb": checkpoint_bytes / 1e9,
        "checkpoint_s": checkpoint_s,
        "resume_s": resume_s,
        # Written beside the loop: what the step after a checkpoint waited for its write.
        "checkpoint_wait_s": statistics.mean(r.get("checkpoint_wait_s", 0.0) for r in train[1:]),
        "generated_tokens": sum(c["tether_actor_generated_tokens_total"] for c in last_counters),
        "update_stall_s": _per_update_stall_s(last_counters),
        **{f"{role}_peak_gb": peak / 1e9 for role, peak in roles.items()},
    }
    figures["learner_vs_bare"] = figures["learner_tokens_per_s"] / bare_tokens_per_s
    figures["learner_rss_vs_bare"] = roles["learner"] / bare_peak
    # Training state: fp32 weights, gradients and AdamW's two moments, 16 bytes a parameter.
    # What the bare loop holds beyond it is its activations (and the interpreter's own).
    figures["learner_rss_x_state"] = roles["learner"] / (4 * weights)
    figures["bare_activation_gb"] = max(0, bare_peak - 4 * weights) / 1e9
    for role, peak in roles.items():
        figures[f"{role}_rss_x_weights"] = peak / weights
    figures["broadcast_of_loopback"] = statistics.median(broadcast) / machine["loopback"]
    figures["wire_of_loopback"] = figures["broadcast_wire_mb_per_s"] * 1e6 / machine["loopback"]
    figures["checkpoint_x_disk"] = checkpoint_s / (checkpoint_bytes / machine["disk_write"])
    figures["resume_x_disk"] = resume_s / (checkpoint_bytes / machine["disk_read"])
    return figures


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = ("learner_vs_bare", "learner_rss_vs_bare", "learner_rss_x_state",
              "actor_rss_x_weights", "wire_of_loopback", "broadcast_of_loopback",
              "checkpoint_x_disk", "resume_x_disk")  # fmt: skip
    series = {"fp32": [s for s in results if "@" not in s],
              "bf16": [s for s in results if s.endswith("@bf16")]}  # fmt: skip
    figure, axes = plt.subplots(2, 4, figsize=(15, 6.5), sharex=True)
    for axis, ratio in zip(axes.flat, ratios, strict=False):
        for label, sizes in series.items():
            if sizes:
                params = [results[s]["params"] for s in sizes]
                values = [results[s].get(ratio, float("nan")) for s in sizes]
                axis.plot(params, values, "o-" if label == "fp32" else "s", label=label)
        axis.set_xscale("log")
        axis.set_title(ratio, fontsize=10)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    for axis in axes[-1]:
        axis.set_xlabel("parameters (151,936-row vocabulary)")
    axes.flat[0].legend(fontsize=8)
    figure.suptitle("Tether at growing model sizes, CPU: each cost over the machine's own")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from learner.trainer.model_init import native_cpu_bf16

    # bf16 where the CPU multiplies it natively: elsewhere torch emulates it.
    bf16 = ["0.5B@bf16"] if native_cpu_bf16() else []
    parser.add_argument("--sizes", default=",".join([*(s.name for s in LADDER), *bf16]),
                        help="ladder sizes; SIZE@bf16 runs that size in bf16 (by default "
                             "only on a CPU with native bf16)")  # fmt: skip
    args = parser.parse_args()
    by_name = {s.name: s for s in LADDER}
    runs = [(token, by_name[token.partition("@")[0]], token.endswith("@bf16"))
            for token in args.sizes.split(",")]  # fmt: skip
    from demo.qwen_vocab import build_qwen_vocab_tokenizer
    from demo.tinymodel import default_cache_root

    tokenizer_dir = build_qwen_vocab_tokenizer()
    cache = default_cache_root() / "scale"
    cache.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="tether-scale-") as scratch, load_average() as load:
        write_read = disk_bytes_per_s(Path(scratch))
        machine = {"loopback": loopback_bytes_per_s(), "disk_write": write_read["write"],
                   "disk_read": write_read["read"]}  # fmt: skip
        for name, shape, bf16 in runs:
            started = time.monotonic()
            model_dir = shape.build(tokenizer_dir, cache)
            print(f"== {name}: {shape.num_params / 1e6:.0f}M parameters, run", flush=True)
            work = Path(scratch) / name
            results[name] = measure(shape, model_dir, work, machine, bf16=bf16)
            shutil.rmtree(work)  # a 0.5B run leaves ~15 GB of checkpoints and snapshots
            print(f"== {name} took {time.monotonic() - started:.0f} s", flush=True)
    figures = {"loopback_mb_per_s": machine["loopback"] / 1e6,
               "disk_write_mb_per_s": machine["disk_write"] / 1e6,
               "disk_read_mb_per_s": machine["disk_read"] / 1e6, **load}  # fmt: skip
    for size, values in results.items():
        figures.update({f"{size}/{key}": value for key, value in values.items()})
    report("scale", "Scale ladder: each cost over the machine's own", figures)
    plot(results, RESULTS_DIR / "scale.png")


if __name__ == "__main__":
    main()
