"""Asynchrony's speedup: the same workload for the same number of learner steps with
`max_staleness = 0` (synchronous: generation of step s waits for update s-1) and with the
default bound (1), on a multi-turn tool environment with heavy-tailed tool latency.

    workload:  `make run` itself (python -m deploy.local, configs/demo.toml: the shipped
               warm-started tiny model, calculator rows, 8 prompts x 8 samples, up to 3
               turns of up to 64 tokens, learner on one torch thread, one actor replica
               with its engine pinned to the first core), with every `add` call first waiting a
               log-normal latency (median 50 ms, p99 2 s: `[envserver.calculator]`,
               envservers/latency.py); in-run evals only at v0 and at the end (16
               prompts). The model calls the tool on about half the episodes at first and
               more as it learns; its responses run from a few tokens (a guessed answer)
               to a call, a result and an answer.
    cores:     as `make run` allots them: engine i pinned to core i (OpenMP), the learner's
               one torch thread, the env server, nats-server and the actors' Python loops
               left to the OS on the same two cores. The learner and the engines compete;
               the synchronous mode gives the learner the machine while engines wait.
    clock:     steady state: from the first step's record to the last (step 1 waits for
               the engines to start); learner figures from metrics.jsonl, engine figures
               from the actors' counters (bench/tether_run.py).

Per mode: seconds per step, learner idle fraction (waiting for data / wall), actor idle
fraction (1 - engine busy: no generation in flight, averaged over replicas), trained and
generated tokens/s. `speedup` = synchronous seconds per step / asynchronous. A GPU model
(separate devices; marked as a model in the output) is computed from the synchronous run's
parts: see `gpu_model`.

Writes bench/results/async.json (`speedup`, `learner_idle_frac`, `actor_idle_frac` of the
asynchronous mode; targets: >= 2.5x, both under 0.10).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.async_support import gpu_model, mode_figures, workload_overrides
from bench.common import Benchmark, load_average, report

BENCHMARK = Benchmark(
    measures="asynchrony's speedup over the synchronous mode, same workload and steps",
    target="bench",
    minutes=3,
)


def combine(sync: dict, asynchronous: dict, args, loads: dict[str, float]) -> dict:
    figures = {
        "speedup": sync["s_per_step"] / asynchronous["s_per_step"],
        "learner_idle_frac": asynchronous["learner_idle_frac"],
        "actor_idle_frac": asynchronous["actor_idle_frac"],
    }
    figures.update({f"sync_{k}": v for k, v in sync.items()})
    figures.update({f"async_{k}": v for k, v in asynchronous.items()})
    figures.update(gpu_model(sync))
    figures.update(
        steps=args.steps,
        async_max_staleness=args.staleness,
        actor_replicas=args.replicas,
        tool_latency_median_ms=args.median_ms,
        tool_latency_p99_s=args.p99_s,
        **loads,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="learner steps per mode")
    parser.add_argument("--staleness", type=int, default=1, help="the asynchronous bound")
    parser.add_argument("--replicas", type=int, default=1, help="actor replicas (engines)")
    parser.add_argument("--median-ms", type=float, default=50.0, help="tool latency median")
    parser.add_argument("--p99-s", type=float, default=2.0, help="tool latency p99")
    parser.add_argument("--work-dir", type=Path, help="keep the runs here (default: temp)")
    args = parser.parse_args()

    from bench.tether_run import watch_run

    with load_average() as loads, tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        work = args.work_dir or Path(tmp)
        measured = {}
        for name, bound in (("sync", 0), ("async", args.staleness)):
            print(f"{name}: max_staleness = {bound}, {args.steps} steps ...", flush=True)
            (work / name).mkdir(parents=True, exist_ok=True)
            steps = dict(steps=args.steps, replicas=args.replicas)
            latency = dict(median_ms=args.median_ms, p99_s=args.p99_s)
            run = watch_run(workload_overrides(bound=bound, **steps, **latency), work / name)
            measured[name] = mode_figures(run)
    figures = combine(measured["sync"], measured["async"], args, loads)
    report(
        "async",
        "asynchrony: same workload, max_staleness 0 vs the default bound (model_gpu_*: a MODEL)",
        figures,
    )


if __name__ == "__main__":
    main()
