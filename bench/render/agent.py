"""Renderer of bench/agent_workflow.py: the agent walkthrough's calculator agent (plain
`openai` calls through the replica's endpoint, run on the env server) against the same run
with the calculator environment stepped by the actor."""

from __future__ import annotations

from bench.render.markdown import Figures, check, count, fixed, join, provenance, table

KINDS = (
    ("stepped", "the calculator env, stepped by the actor (`make run`)"),
    ("agent", "the walkthrough's agent, through the endpoint"),
)
PLACEMENTS = (
    ("shared", "all on every core"),
    ("apart", "env server on a core of its own"),
)
HEADER = [
    "cores",
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
        " is what the actor generated between the first and the last training step. Cores:"
        " every process on both (`shared`), or the env server, where the agent's code runs,"
        " alone on one and the rest on the other (`apart`), for both runs of a pair."
    )
    rows = [
        [
            place,
            label,
            _range(f, f"{placement}_{kind}_pass_at_1_start"),
            _range(f, f"{placement}_{kind}_pass_at_1_end"),
            count(f.get(f"{placement}_{kind}_tokens_per_s_mean")),
            fixed(f.get(f"{placement}_{kind}_s_per_step_mean"), 2),
            fixed(f.get(f"{placement}_{kind}_bound_max_mean"), 1),
            fixed(f.get(f"{placement}_{kind}_tool_time_fraction_mean"), 2),
        ]
        for placement, place in PLACEMENTS
        for kind, label in KINDS
    ]
    targets = [
        check(
            f"rollout tokens/s, the agent's over the stepped run's, {place} (worst pair;"
            f" mean {fixed(f.get(f'{placement}_tokens_per_s_ratio_mean'), 3)})",
            f.get(f"{placement}_tokens_per_s_ratio_min"),
            0.9,
            ">=",
            lambda v: fixed(v, 2),
        )
        for placement, place in PLACEMENTS
    ]
    return join(setup, table(HEADER, rows), "\n".join(targets), provenance(f))
