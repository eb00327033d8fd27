"""What a long-lived weight communicator saves per update, on gloo (this machine has no GPU).

Two receiver processes (tests/weights/receiver_process.py, each one engine worker's channel)
follow ROUNDS rounds of a 4 MiB model (the demo model's size in fp32) over one long-lived
group; then ROUNDS more in which the sender drops its group before every round, so that
each version forms a fresh group, as the weight path did before (one group per version).
The figure is the median learner-side time of a round (planning + waiting for the
receivers + forming the group when new + sending), and the saving between the two.

    python -m bench.weight_group [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import Benchmark, load_average, print_table, write_results

BENCHMARK = Benchmark(
    measures="what a long-lived weight communicator saves per update (gloo)",
    target="bench",
    minutes=0.1,
)

REPO = Path(__file__).resolve().parent.parent

RECEIVER = REPO / "tests" / "weights" / "receiver_process.py"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    import torch

    from weights.config import WeightSyncConfig
    from weights.learner_side.sender import WeightSender

    sender = WeightSender(
        WeightSyncConfig(store_port=0, backend="gloo", join_timeout_s=30, transfer_timeout_s=60)
    )
    weights = [(f"w{i}", torch.randn(128 * 1024)) for i in range(8)]  # 8 x 512 KiB = 4 MiB
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    address = f"127.0.0.1:{sender.config.store_port}"
    receivers = [
        subprocess.Popen(
            [sys.executable, str(RECEIVER), address, str(2 * args.rounds + 1)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    for proc in receivers:
        assert proc.stdout.readline().strip() == "ready"
    while sum(s == "alive" for s in sender.members().values()) < 2:
        time.sleep(0.05)

    def round_s(version: int, fresh: bool) -> float:
        if fresh:
            sender._discard_group()  # the old behaviour: a new group for every version
        started = time.perf_counter()
        report = sender.broadcast(version, weights)
        assert report.ok and report.num_receivers == 2, report
        return time.perf_counter() - started

    try:
        with load_average() as loads:
            round_s(1, fresh=False)  # the first group forms here in both cases
            kept = [round_s(2 + i, fresh=False) for i in range(args.rounds)]
            fresh = [round_s(2 + args.rounds + i, fresh=True) for i in range(args.rounds)]
    finally:
        for proc in receivers:
            proc.kill()
        sender.close()
    kept_ms, fresh_ms = statistics.median(kept) * 1e3, statistics.median(fresh) * 1e3
    figures = {
        "rounds": args.rounds,
        "model_mib": 4,
        "receivers": 2,
        "long_lived_round_ms_median": round(kept_ms, 1),
        "fresh_group_round_ms_median": round(fresh_ms, 1),
        "saved_per_update_ms": round(fresh_ms - kept_ms, 1),
        "fresh_over_long_lived": round(fresh_ms / kept_ms, 2),
        **loads,
    }
    print_table(
        "weight rounds on gloo: long-lived group vs a group per version", list(figures.items())
    )
    write_results("weight_group", figures)


if __name__ == "__main__":
    main()
