"""A real process that exports the learner's Prometheus metrics without training, for the
live Prometheus test: it serves /metrics with `common.metrics.serve_metrics` and feeds
`learner.metrics.record_step` the records learner/loop.py (train) and learner/reporting.py
(eval) write — the learner's own code path, with made-up numbers. Given a bus, it also runs
the learner's queue-depth poll (`learner.bus_metrics.poll`) on that run's real streams:
the tether_bus_* gauges come from JetStream itself.

    python -m tests.deploy.learner_producer PORT [--bus NATS_URL NAMESPACE]

Runs until killed (SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio

from broker import client
from broker.names import BusNames
from common.metrics import serve_metrics
from learner import bus_metrics
from learner import metrics as learner_metrics

PROMPTS_PER_STEP = 4
GROUP_SIZE = 4


def train_record(step: int) -> dict:
    """Step `step`'s record, shaped like learner/loop.py's (cumulative counts included)."""
    staleness = [0, 1, 1, 1]  # per group: version - oldest token version
    dropped = step // 3  # a stale group's samples every third step
    return {
        "kind": "train",
        "step": step,
        "version": step,
        "reward_mean": min(0.3 + 0.02 * step, 1.0),
        "staleness": staleness,
        "staleness_max_batch": max(staleness),
        "tokens_per_s": 1800.0 + 10 * (step % 5),
        "num_tokens": 2400,
        "wait_data_s": 0.04,
        "train_s": 0.2,
        "broadcast_s": 0.03,
        "trained": step * PROMPTS_PER_STEP * GROUP_SIZE,
        "dropped": dropped * GROUP_SIZE,
        "dropped_by_reason": {"stale": dropped * GROUP_SIZE} if dropped else {},
        "train/loss": 0.1 / step,
        "train/grad_norm": 0.5,
    }


def eval_record(pass_at_1: float) -> dict:
    """An eval record as learner/reporting.py passes it to learner.metrics (no `version`)."""
    return {
        "kind": "eval",
        "pass_at_1": pass_at_1,
        "eval/all/pass_at_1": pass_at_1,
        "eval/env/calculator/pass_at_1": pass_at_1,
    }


async def _record_steps(interval_s: float) -> None:
    step = 0
    while True:
        step += 1
        learner_metrics.record_step(train_record(step))
        if step % 3 == 0:
            learner_metrics.record_step(eval_record(min(0.5 + 0.01 * step, 1.0)))
        await asyncio.sleep(interval_s)


async def _poll_bus(url: str, namespace: str, interval_s: float) -> None:
    nc = await client.connect(url, name="learner-producer")
    try:
        await bus_metrics.poll(nc.jetstream(), BusNames(namespace), interval_s=interval_s)
    finally:
        await nc.close()


async def _run(args: argparse.Namespace) -> None:
    jobs = [_record_steps(args.interval_s)]
    if args.bus:
        jobs.append(_poll_bus(*args.bus, interval_s=args.bus_interval_s))
    await asyncio.gather(*jobs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.deploy.learner_producer")
    parser.add_argument("port", type=int)
    parser.add_argument("--interval-s", type=float, default=0.3, help="seconds per step")
    parser.add_argument("--bus", nargs=2, metavar=("NATS_URL", "NAMESPACE"))
    parser.add_argument("--bus-interval-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    port = serve_metrics(args.port)
    print(f"learner metrics on port {port}", flush=True)
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
