"""Bring your agent, measured: the calculator agent of docs/running.md ("Bring your agent",
its module as written there) trained by `python -m deploy.local`, against the same run
with the calculator environment stepped by the actor (`make run`).

Both runs are configs/demo.toml; the agent's also hosts
`calculator=workflow:my_agent.calculator:solve`, so the demo's own rows go to the agent, and
every model call goes through the replica's chat-completions endpoint, the `openai` client
and the env server. Per repeat the two run back to back on the same machine (the order
alternates), and each is read from outside (bench/tether_run.py):

- eval pass@1 at v0 and at the last step (100 rows x 2 samples, unseeded sampling);
- rollout tokens/s: tokens the actor generated between the first and the last train record
  over those seconds (the endpoint path's over the stepped path's, per repeat: the ratio);
- seconds per step over the same span;
- the staleness bound the demo's "auto" reached and the share of episode time in tools it
  reads (learner/bound.py): a bound above 1 trains with the correction's extra forward.

Each placement runs its own pairs: `shared`, every process on every core (`make run` on
one machine), and `apart`, the env server alone on the last core and the rest on the
others, as in a deployment where env servers (and the agents' own code: its `openai`
client, its tools) have machines of their own. The stepped run is placed the same way, so
each pair gets the same cores.

    python -m bench.agent_workflow [--repeats 3] [--steps 30] [--placements shared,apart]

Writes bench/results/agent_workflow.json and prints the table. About 3 minutes a run on 2
cores.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
from pathlib import Path

from bench.common import Benchmark, load_average, report
from bench.tether_run import RunRecord, actor_counter_at, watch_run

BENCHMARK = Benchmark(
    measures="an agent's own openai loop through the endpoint against the stepped env",
    target="by hand",
    minutes=15,
)

REPO = Path(__file__).resolve().parents[1]
PLACEMENTS = ("shared", "apart")
SECTION = "## Bring your agent"
AGENT = [
    'envserver.envs=["calculator=workflow:my_agent.calculator:solve"]',
    'envserver.plugins={"calculator": {"time_limit_s": 60}}',
]


def write_agent(home: Path) -> Path:
    """The walkthrough's package written under `home`; the directory to import it from."""
    text = (REPO / "docs" / "running.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    for path, body in re.findall(r"```python file=(my-agent/\S+)\n(.*?)```", section, re.S):
        (home / path).parent.mkdir(parents=True, exist_ok=True)
        (home / path).write_text(body)
    return home / "my-agent"


def pin_env_servers_apart(launcher_pid: int) -> None:
    """Every thread of the run's env servers onto the last CPU, every other thread of the
    run onto the others. Called on every poll: threads and processes started since then
    (the engine's, gRPC's) inherit their creator's CPUs and are moved on the next."""
    cpus = sorted(os.sched_getaffinity(0))
    apart, rest = {cpus[-1]}, set(cpus[:-1])
    pending = [launcher_pid]
    while pending:
        pid = pending.pop()
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            for tid in os.listdir(f"/proc/{pid}/task"):
                children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                pending += map(int, children)
                os.sched_setaffinity(int(tid), apart if b"envservers.cli" in command else rest)
        except (FileNotFoundError, ProcessLookupError):  # ended while we looked
            continue


def figures(run: RunRecord) -> dict[str, float]:
    """pass@1 at the start and end, rollout tokens/s and s/step over the training steps, the
    highest bound in force and the mean time in tools."""
    train, evals = run.train, run.evals
    first, last = train[0]["t"], train[-1]["t"]
    tokens = "tether_actor_generated_tokens_total"
    generated = actor_counter_at(run, tokens, last) - actor_counter_at(run, tokens, first)
    return {
        "pass_at_1_start": evals[0]["eval/all/pass_at_1"],
        "pass_at_1_end": evals[-1]["eval/all/pass_at_1"],
        "tokens_per_s": generated / (last - first),
        "s_per_step": (last - first) / (len(train) - 1),
        "bound_max": max(record["max_staleness"] for record in train),
        "tool_time_fraction": statistics.fmean(
            record.get("rollout/all/tool_time_fraction", 0.0) for record in train
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--placements", default="shared,apart")
    args = parser.parse_args(argv)
    placements = args.placements.split(",")
    if not set(placements) <= set(PLACEMENTS):
        parser.error(f"--placements: a list of {', '.join(PLACEMENTS)}, got {args.placements}")
    if "apart" in placements and len(os.sched_getaffinity(0)) < 2:
        parser.error("--placements apart: needs at least 2 CPUs (one for the env server)")
    out: dict[str, float | int | str] = {"repeats": args.repeats, "steps": args.steps}
    with tempfile.TemporaryDirectory() as work, load_average() as loads:
        agent_dir = write_agent(Path(work))
        for placement in placements:
            out.update(measure_pairs(placement, args, agent_dir, Path(work) / placement))
    out.update(loads)
    report("agent_workflow", "agent workflow vs stepped environment (same demo run)", out)


def measure_pairs(
    placement: str, args: argparse.Namespace, agent_dir: Path, work: Path
) -> dict[str, float]:
    """`args.repeats` pairs under one placement: each figure's mean, min and max per run
    kind, and the agent's tokens/s over the stepped run's (worst pair, mean), keyed
    `<placement>_...`."""
    steps = [f"learner.total_steps={args.steps}"]
    on_poll = (
        (lambda run, launcher, t: pin_env_servers_apart(launcher.pid))
        if placement == "apart"
        else None
    )
    rows: dict[str, list[dict[str, float]]] = {"stepped": [], "agent": []}
    for repeat in range(args.repeats):
        for kind in ["stepped", "agent"] if repeat % 2 == 0 else ["agent", "stepped"]:
            overrides = steps + (AGENT if kind == "agent" else [])
            pythonpath = (agent_dir,) if kind == "agent" else ()
            run = watch_run(overrides, work / f"{kind}{repeat}", pythonpath=pythonpath,
                            on_poll=on_poll)  # fmt: skip
            rows[kind].append(figures(run))
            print(f"{placement} repeat {repeat} {kind}: {rows[kind][-1]}", flush=True)
    out = {}
    for kind, measured in rows.items():
        for name in measured[0]:
            values = [m[name] for m in measured]
            key = f"{placement}_{kind}_{name}"
            out[f"{key}_mean"] = statistics.fmean(values)
            out[f"{key}_min"], out[f"{key}_max"] = min(values), max(values)
    pairs = zip(rows["agent"], rows["stepped"], strict=True)
    ratios = [agent["tokens_per_s"] / stepped["tokens_per_s"] for agent, stepped in pairs]
    out[f"{placement}_tokens_per_s_ratio_min"] = min(ratios)
    out[f"{placement}_tokens_per_s_ratio_mean"] = statistics.fmean(ratios)
    return out


if __name__ == "__main__":
    main()
