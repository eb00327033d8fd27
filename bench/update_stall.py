"""The generation stall per weight update on the demo, streamed rounds against staged ones
how many decode steps an engine loses to each update.

One vLLM engine on the demo model (`demo/tiny_model`, 0.9 M parameters), fed by the real
weight sender in a process of its own (bench/weightsync.py's), while it decodes a batch of
long requests: 64 on the demo (its `max_num_seqs`, which its 8 prompts x 8 samples fill).
Then the same on weightsync's larger random model (28.7 M parameters, 115 MB; 16 requests),
where receiving costs more than loading. Rounds alternate between the two ways an engine
takes an update, on the same engine and in the same run (the worker decides per round):

    streamed  pause, then receive and load each bucket as it arrives, relabel, resume
    staged    receive the whole version into host memory while generating
              (weights/engine_side/staging.py), then pause for the load alone, relabel, resume
    swapped   staged, and loaded into a second copy of the model while generating too
              (`weight_swap`, weights/engine_side/shadow.py): the pause swaps the two by reference

The stall is the longest gap between two tokens overlapping the update; the decode step
the median gap before it (bench/weightsync.py `stall_of`). Also the engine's own account
(`WeightUpdate`: pause, receive, load). Medians over rounds; writes
bench/results/update_stall.json. Not part of `make bench` (`python -m bench.update_stall`,
two or three minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import tempfile
from pathlib import Path
from statistics import median

from bench.common import Benchmark, load_average, report
from bench.weightsync import (
    follow,
    max_model_len,
    one_round,
    sender_main,
    width_config,
)
from demo.engine import decode_arrivals
from demo.random_model import random_qwen2

BENCHMARK = Benchmark(
    measures="the generation stall per update: streamed, staged and swapped",
    target="by hand",
    minutes=3,
)

MODES = {  # the engine settings of each way to take an update
    "streamed": {"staged_weight_load": False, "weight_swap": False},
    "staged": {"staged_weight_load": True, "weight_swap": False},
    "swapped": {"staged_weight_load": True, "weight_swap": True},
}


async def measure(conn, model_dir: Path, rounds: int, batch: int) -> dict[str, list[dict]]:
    from actors.vllm_engine import VllmEngine, VllmEngineConfig

    address = f"127.0.0.1:{conn.recv()}"
    config = VllmEngineConfig(
        model=str(model_dir), max_model_len=max_model_len(model_dir), max_num_seqs=batch
    )
    engine = await VllmEngine.start(config)
    updates: dict = {}
    measured = {mode: [] for mode in MODES}
    followers = []
    stop = asyncio.Event()  # the rest of the batch, decoding through every round
    others = [asyncio.create_task(decode_arrivals(engine, stop, [])) for _ in range(batch - 1)]
    try:
        followers = await follow({0: engine}, address, updates, conn, 1)
        for version in range(1, len(MODES) * rounds + 1):
            mode = list(MODES)[version % len(MODES)]
            engine.config = config.model_copy(update=MODES[mode])
            measured[mode].append(await one_round(conn, version, {0: engine}, updates))
    finally:
        stop.set()
        await asyncio.gather(*others, return_exceptions=True)
        for follower, task in followers:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await follower.leave()
        engine.shutdown()
    return measured


def summarize(measured: dict[str, list[dict]], case: str) -> dict:
    figures: dict = {}
    for mode, rounds in measured.items():
        key = f"{case}_{mode}"
        stall = 1e3 * median(r["stall_s"] for r in rounds)
        step = 1e3 * median(r["decode_step_s"] for r in rounds)
        figures.update({f"stall_ms_{key}": stall, f"decode_step_ms_{key}": step})
        figures[f"stall_in_decode_steps_{key}"] = stall / step
        for part in ("stall", "pause", "receive", "load"):
            figures[f"engine_{part}_ms_{key}"] = 1e3 * median(r[f"engine_{part}_s"] for r in rounds)
    for mode in ("staged", "swapped"):
        figures[f"{mode}_vs_streamed_{case}"] = (
            figures[f"stall_ms_{case}_{mode}"] / figures[f"stall_ms_{case}_streamed"]
        )
    return figures


def run_case(case: str, model_dir: Path, rounds: int, batch: int) -> dict:
    """One model: its own sender process and engine."""
    from weights.formats.snapshot import safetensors_weights

    context = mp.get_context("spawn")
    conn, child_conn = context.Pipe()
    sender = context.Process(target=sender_main, args=(child_conn, str(model_dir)))
    sender.start()
    try:
        measured = asyncio.run(measure(conn, model_dir, rounds, batch))
        conn.send(("stop",))
        conn.recv()
    finally:
        sender.join(timeout=30)
        if sender.is_alive():
            sender.kill()
    nbytes = sum(t.numel() * t.element_size() for _, t in safetensors_weights(model_dir))
    return {**summarize(measured, case), f"batch_{case}": batch, f"weight_bytes_{case}": nbytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each kind (median)")
    args = parser.parse_args()

    from demo.tinymodel import shipped_model_dir

    figures: dict = {"rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="update-stall-") as tmp, load_average() as loads:
        larger = random_qwen2(Path(tmp) / "model", width_config(hidden=768, layers=4))
        for case, model_dir, batch in (("demo", shipped_model_dir(), 64), ("28m", larger, 16)):
            figures.update(run_case(case, model_dir, args.rounds, batch))
    figures.update(loads)
    report("update_stall", "generation stall per update: streamed, staged, swapped", figures)


if __name__ == "__main__":
    main()
