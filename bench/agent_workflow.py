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

    python -m bench.agent_workflow [--repeats 3] [--steps 30]

Writes bench/results/agent_workflow.json and prints the table. About 3 minutes a run on 2
cores.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args(argv)
    steps = [f"learner.total_steps={args.steps}"]
    out: dict[str, float | int | str] = {"repeats": args.repeats, "steps": args.steps}
    rows: dict[str, list[dict[str, float]]] = {"stepped": [], "agent": []}
    with tempfile.TemporaryDirectory() as work, load_average() as loads:
        agent_dir = write_agent(Path(work))
        for repeat in range(args.repeats):
            order = ["stepped", "agent"] if repeat % 2 == 0 else ["agent", "stepped"]
            for kind in order:
                run_dir = Path(work) / f"{kind}{repeat}"
                overrides = steps + (AGENT if kind == "agent" else [])
                pythonpath = (agent_dir,) if kind == "agent" else ()
                run = watch_run(overrides, run_dir, pythonpath=pythonpath)
                rows[kind].append(figures(run))
                print(f"repeat {repeat} {kind}: {rows[kind][-1]}", flush=True)
    for kind, measured in rows.items():
        for name in measured[0]:
            values = [m[name] for m in measured]
            out[f"{kind}_{name}_mean"] = statistics.fmean(values)
            out[f"{kind}_{name}_min"], out[f"{kind}_{name}_max"] = min(values), max(values)
    pairs = zip(rows["agent"], rows["stepped"], strict=True)
    ratios = [agent["tokens_per_s"] / stepped["tokens_per_s"] for agent, stepped in pairs]
    out["tokens_per_s_ratio_min"] = min(ratios)
    out["tokens_per_s_ratio_mean"] = statistics.fmean(ratios)
    out.update(loads)
    report("agent_workflow", "agent workflow vs stepped environment (same demo run)", out)


if __name__ == "__main__":
    main()
