"""What an actor replica killed mid-episode costs, with turn-level episode checkpoints and
without them, on the same work: deploy/resume_scenario.py's scenario (real
nats-server, the calculator env server with ~1.5 s tool calls, two replicas with real vLLM
engines on the shipped warm-start model; one prompt task of `--group-size` samples; the
replica holding it SIGKILLed when `--kill-at` of its episodes have recorded a turn).

    checkpoints   as shipped: the task comes back after the ack wait and the other replica
                  continues each unfinished sample from its last turn, skipping stored ones
    before        the dead replica's checkpoints purged as it dies: the task is played as
                  before this change (every unfinished sample from its first token, the
                  stored ones once more, deduplicated by the stream)

Per mode, over `--trials` interleaved trials (medians): tokens the dead replica had
generated that were generated again, samples continued and resumed, tokens saved, and the
seconds from the kill until the task's last trajectory is stored (the ack wait, 4 s here,
included). Writes bench/results/episode_resume.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import Benchmark, load_average, report
from deploy.resume_scenario import run_scenario

BENCHMARK = Benchmark(
    measures="a replica killed mid-episode, with and without turn checkpoints",
    target="by hand",
    minutes=3,
)

MODES = {"checkpoints": False, "before": True}  # mode -> the dead replica's checkpoints purged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--kill-at", type=int, default=1)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with load_average() as loads:
        for trial in range(args.trials):
            for mode, forget in MODES.items():
                with tempfile.TemporaryDirectory(prefix="episode-resume-") as work:
                    outcome = asyncio.run(
                        run_scenario(
                            Path(work),
                            group_size=args.group_size,
                            kill_at=args.kill_at,
                            forget=forget,
                        )  # fmt: skip
                    )
                figures = outcome.figures()
                print(f"trial {trial} {mode}: {figures}", flush=True)
                runs[mode].append(figures)
    results: dict[str, float | int | str] = {
        "trials": args.trials, "group_size": args.group_size, "kill_at": args.kill_at, **loads,
    }  # fmt: skip
    for mode, figures in runs.items():
        for name in figures[0]:
            results[f"{mode}_{name}"] = statistics.median(f[name] for f in figures)
    before = results["before_tokens_regenerated"]
    results["tokens_regenerated_ratio"] = (
        results["checkpoints_tokens_regenerated"] / before if before else float("nan")
    )
    results["seconds_ratio"] = (
        results["checkpoints_seconds_kill_to_done"] / results["before_seconds_kill_to_done"]
    )
    report("episode_resume", "A replica killed mid-episode: checkpoints vs before", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
