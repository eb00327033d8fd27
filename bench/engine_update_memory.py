"""Engine host memory during one weight update, streamed against staged (the
target: the engine receives a bucketed update with host memory growth of at most two buckets).

    model:    a random-init Qwen2 of Qwen2-0.5B's shape (hidden 896, 24 layers, MLP 4864,
              14 heads, 2 KV heads, tied embeddings, vocab 151936: 494 M parameters, 1885 MB
              of fp32) with the demo tokenizer, built once under .cache/bench/
              (demo/random_model.py); `--small`: a 4-layer model of width 1024 (174 MB; what
              the test runs). MB: 2**20 bytes.
    measure:  deploy/engine_memory.py `measure`, the test's measurement too: one real vLLM
              CPU engine, a plain receiver process first (the receive path's own memory),
              then `--rounds` streamed and staged rounds of `--bucket-mb` buckets, each
              process's VmHWM after a round less its VmRSS before it.

The largest growth over each mode's rounds is reported (the bound is what matters), with the
engine's stall and the sender's transfer time per round (medians). Writes
bench/results/engine_update_memory.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from bench.common import Benchmark, load_average, report
from demo.random_model import QWEN2_0_5B, SMALL, build_model
from deploy.engine_memory import measure

BENCHMARK = Benchmark(
    measures="an engine's host memory during one weight update, streamed against staged",
    target="bench",
    minutes=2,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help=f"the {SMALL} model")
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds per mode")
    args = parser.parse_args()
    shape = SMALL if args.small else QWEN2_0_5B
    model_dir = build_model(shape)
    with load_average() as loads:
        figures = asyncio.run(measure(model_dir, bucket_mb=args.bucket_mb, rounds=args.rounds))
    figures.update(loads, model=shape, cpus=os.cpu_count())
    report("engine_update_memory", "Engine host memory per weight update", figures)


if __name__ == "__main__":
    main()
