"""`make soak`: the demo workload under random SIGKILLs of every kind of process, for about
20 minutes; then the numbers that say whether Tether survives a multi-day run.

    python -m deploy.soak [--minutes 20] [--every-s 60] [--steps N] [--seed 0] [key=value ...]

    deploy.local (demo config) ─► a fault every ~every_s (0.5-1.5x, random), cycling through
    nats-server, envserver (killed, or hung with SIGSTOP), learner, actor (every replica),
    replica, engine; memory of every process sampled every 10 s
    end ─► faults and stalls, memory growth per process, restarts, the ledger

A stall is the time from a fault to the next new training step, less the run's median time
between steps. Memory growth is per process, from its first sample a minute after it
started (its warm-up done) to its last. Everything also goes to `<run>/soak.json`.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from common.supervision import read_events
from deploy import proctree
from deploy.chaos import ChaosRun, Fault, Outcome, restarted_within, role_sessions
from deploy.run_ledger import RunLedger

KINDS = [
    ("nats-server", signal.SIGKILL),
    ("envserver", signal.SIGKILL),
    ("envserver", signal.SIGSTOP),
    ("learner", signal.SIGKILL),
    ("actor", signal.SIGKILL),
    ("replica", signal.SIGKILL),
    ("engine", signal.SIGKILL),
]
WORKLOAD = [
    "local.actor_replicas=2",  # a killed replica's groups are re-played by the other
    "local.num_eval_rows=20",  # the demo's eval set, smaller: evals every 10 steps
    "learner.eval_interval=10",
    "learner.checkpoint.interval=5",
]
SAMPLE_EVERY_S = 10.0
STEP_S_GUESS = 2.0
"""Seconds per step of the demo on a 2-core machine (2.4 s measured, faults included): the
default step count makes the run last at least as long as the faults go on."""
WARM_UP_S = 60.0


def schedule(minutes: float, every_s: float, rng: random.Random) -> list[Fault]:
    """Faults at random intervals (0.5-1.5 x every_s) from the first training step until
    `minutes` have passed, each kind in turn (shuffled once per round)."""
    faults, at, kinds = [], 0.0, []
    while True:
        at += every_s * rng.uniform(0.5, 1.5)
        if at > minutes * 60:
            return faults
        if not kinds:
            kinds = rng.sample(KINDS, len(KINDS))
        target, signum = kinds.pop()
        faults.append(Fault(target, at_s=at, signum=signum))


class MemorySampler:
    """RSS of every process of the run (every session a role leads), every SAMPLE_EVERY_S."""

    def __init__(self) -> None:
        self.samples: dict[int, list[tuple[float, int]]] = defaultdict(list)
        self.kinds: dict[int, str] = {}
        self._next = 0.0

    def __call__(self, run_dir: Path) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + SAMPLE_EVERY_S
        services = role_sessions(run_dir)
        table = proctree.processes()
        for proc in table.values():
            if proc.sid in services and proc.command:
                self.kinds.setdefault(proc.pid, _kind(proc, services))
                self.samples[proc.pid].append((now, proc.rss_bytes))

    def growth(self) -> list[dict]:
        """Per process: kind, MB after warm-up, MB at the end, growth, minutes observed."""
        rows = []
        for pid, samples in self.samples.items():
            start = samples[0][0]
            warm = [(t, rss) for t, rss in samples if t - start >= WARM_UP_S]
            if len(warm) < 2:
                continue  # did not live long enough to say
            (t0, first), (t1, last) = warm[0], warm[-1]
            rows.append(
                {
                    "pid": pid,
                    "kind": self.kinds[pid],
                    "first_mb": round(first / 2**20, 1),
                    "last_mb": round(last / 2**20, 1),
                    "growth_mb": round((last - first) / 2**20, 1),
                    "minutes": round((t1 - t0) / 60, 1),
                }
            )
        return sorted(rows, key=lambda r: (r["kind"], -r["minutes"]))


def _kind(proc: proctree.ProcInfo, services: dict[int, str]) -> str:
    if proc.pid in services:
        return services[proc.pid]
    if proc.command.startswith("VLLM::"):
        return "engine " + proc.command.split("::")[1].split()[0]
    if "spawn_main" in proc.command:
        return "replica"
    return f"{services[proc.sid]} helper"


def stalls(outcome: Outcome) -> tuple[list[dict], float]:
    times = sorted(outcome.step_times.values())
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    median = statistics.median(gaps) if gaps else 0.0
    rows = []
    for (fault, pids, at), wall in zip(outcome.struck, outcome.struck_wall, strict=True):
        next_step = outcome.next_step_after(at)
        restarted = restarted_within(outcome.run_dir, pids, wall)
        rows.append(
            {
                "at_s": round(at - outcome.first_step_at, 1),
                "target": fault.target,
                "signal": signal.Signals(fault.signum).name,
                "pids": pids,
                "restarted_after_s": None if restarted is None else round(restarted, 1),
                "next_step_s": None if next_step is None else round(next_step, 1),
                "stall_s": None if next_step is None else round(max(0.0, next_step - median), 1),
            }
        )
    return rows, median


def report(outcome: Outcome, memory: MemorySampler) -> dict:
    faults, median_step_s = stalls(outcome)
    try:
        ledger = RunLedger.read(outcome.run_dir)
        books = {"summary": ledger.summary(), "problems": ledger.problems()}
    except ValueError as e:  # the learner never finished
        books = {"summary": {}, "problems": [str(e)]}
    restarts = defaultdict(int)
    for event in read_events(outcome.run_dir):
        if event["event"] == "started" and event["restart"]:
            restarts[event["role"]] += 1
    return {
        "exit_code": outcome.code,
        "run_s": round(outcome.run_s, 1),
        "steps": len(outcome.step_times),
        "median_step_s": round(median_step_s, 1),
        "faults": faults,
        "restarts": dict(restarts),
        "memory": memory.growth(),
        "ledger": books,
    }


def print_report(data: dict) -> None:
    print(
        f"\nsoak: exit {data['exit_code']}, {data['run_s']:.0f} s from the first step, "
        f"{data['steps']} steps, median {data['median_step_s']} s per step"
    )
    print("\nfault                 at (s)   restarted (s)   next step (s)   stall (s)")
    for f in data["faults"]:
        name = f"{f['target']} {f['signal']}"
        print(
            f"{name:<20} {f['at_s']:>7}   {f['restarted_after_s']!s:>13}   "
            f"{f['next_step_s']!s:>13}   {f['stall_s']!s:>9}"
        )
    print(f"\nrestarts by the launcher: {data['restarts']}")
    print("\nprocess                  pid   MB after warm-up   MB at end   growth   minutes")
    for m in data["memory"]:
        print(
            f"{m['kind']:<22} {m['pid']:>6} {m['first_mb']:>18} {m['last_mb']:>11} "
            f"{m['growth_mb']:>8} {m['minutes']:>9}"
        )
    print(f"\nledger: {json.dumps(data['ledger']['summary'])}")
    problems = data["ledger"]["problems"]
    print("ledger balances exactly" if not problems else f"LEDGER PROBLEMS: {problems}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=20.0, help="how long faults go on")
    parser.add_argument("--every-s", type=float, default=60.0, help="mean time between faults")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="learner.total_steps (default: enough to train through every fault, at "
        f"{STEP_S_GUESS} s a step)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/soak"))
    parser.add_argument("overrides", nargs="*", help="section.key=value for deploy.local")
    args = parser.parse_args(argv)
    if args.steps is None:
        # The run must outlast the faults: one that ends first leaves the rest unstruck
        # (a 120-step default ended after 6 of the 20 minutes, 4 faults in).
        args.steps = int(args.minutes * 60 / STEP_S_GUESS) + 20
    rng = random.Random(args.seed)
    memory = MemorySampler()
    run = ChaosRun(
        args.runs_dir.resolve(),
        [*WORKLOAD, f"learner.total_steps={args.steps}", "local.timeout_s=14400", *args.overrides],
        faults=schedule(args.minutes, args.every_s, rng),
        timeout_s=4 * 3600,
        on_tick=memory,
        rng=rng,
    )
    outcome = run.run()
    data = report(outcome, memory)
    (outcome.run_dir / "soak.json").write_text(json.dumps(data, indent=2) + "\n")
    print_report(data)
    print(f"\nrun directory: {outcome.run_dir}  (soak.json)")
    return 0 if outcome.code == 0 and not data["ledger"]["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
