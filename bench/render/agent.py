"""Renderer of bench/agent_workflow.py: the agent walkthrough's calculator agent (plain
`openai` calls through the replica's endpoint, run on the env server) against the same run
with the calculator environment stepped by the actor."""

from __future__ import annotations

from bench.render.markdown import Figures, check, count, fixed, join, provenance, table

KINDS = (
    ("stepped", "the calculator env, stepped by the actor (`make run`)"),
    ("agent", "the walkthrough's agent, through the endpoint"),
)
HEADER = [
    "run",
    "eval pass@1 at v0 (min-max)",
    "at the end (min-max)",
    "rollout tokens/s",
    "s per step",
    "highest bound (auto)",
    "time in tools",
]


def _range(f: Figures, name: str) -> str:
    return (
        f"{fixed(f.get(name + '_mean'), 3)} ({fixed(f.get(name + '_min'), 3)}"
        f"-{fixed(f.get(name + '_max'), 3)})"
    )


def agent_workflow(f: Figures) -> str:
    setup = (
        f"{count(f.get('repeats'))} pairs of `python -m deploy.local` runs of"
        f" configs/demo.toml ({count(f.get('steps'))} steps, one replica), back to back in"
        " alternating order; the agent's run also hosts"
        " `calculator=workflow:my_agent.calculator:solve`, the module of docs/running.md's"
        ' "Bring your agent" as written. Means over the pairs, the range in brackets; tokens/s'
        " is what the actor generated between the first and the last training step."
    )
    rows = [
        [
            label,
            _range(f, f"{kind}_pass_at_1_start"),
            _range(f, f"{kind}_pass_at_1_end"),
            count(f.get(f"{kind}_tokens_per_s_mean")),
            fixed(f.get(f"{kind}_s_per_step_mean"), 2),
            fixed(f.get(f"{kind}_bound_max_mean"), 1),
            fixed(f.get(f"{kind}_tool_time_fraction_mean"), 2),
        ]
        for kind, label in KINDS
    ]
    target = check(
        "rollout tokens/s, the agent's over the stepped run's (worst pair)",
        f.get("tokens_per_s_ratio_min"),
        0.9,
        ">=",
        lambda v: fixed(v, 2),
    )
    return join(setup, table(HEADER, rows), target, provenance(f))
