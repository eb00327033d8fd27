"""Renderer of bench/tasks.py: RL against the same steps of plain SFT on reasoning-gym
families nobody here wrote, each warm-started from its own rows, over seeds."""

from __future__ import annotations

from bench.render.markdown import Figures, count, fixed, join, provenance, table

HEADER = [
    "family",
    "start pass@1",
    "end pass@1, RL",
    "end pass@1, SFT",
    "95% band",
    "seconds",
    "held?",
]


def families(f: Figures) -> list[str]:
    return sorted(key.removesuffix("_held") for key in f if key.endswith("_held"))


def verdict(f: Figures, name: str) -> str:
    if f.get(f"{name}_held"):
        return "**yes**"
    if not f.get(f"{name}_rl_above_start"):
        return "no: RL not above its start"
    return "no: RL not above SFT"


def tasks(f: Figures) -> str:
    setup = (
        f"Per family and seed ({f.get('seeds')}): a warm start from the family's own rows"
        f" (`demo.warmstart`, stopped at expected pass@1 {fixed(f.get('stop_at'), 2)}), then"
        f" {count(f.get('steps'))} steps of RL through `python -m deploy.local` ("
        f"{count(f.get('rl_prompts_per_step'))} prompts of 8 samples a step, lr"
        f" {f.get('rl_lr')}) against {count(f.get('steps'))} steps of plain SFT continued on"
        f" the warm start's solved rows (lr {f.get('sft_lr')}). pass@1 at temperature 1 on 128"
        " fresh draws of the task's generator (another seed), 2 samples each, the same"
        " evaluator for every checkpoint. Means over the seeds; the band is the 95% band of a"
        " difference of two such means; `held` when RL's end is above its start and above"
        " SFT's end by more than the band. Seconds: warm start, RL and SFT of all seeds."
    )
    rows = [
        [
            name,
            fixed(f.get(f"{name}_start"), 3),
            fixed(f.get(f"{name}_rl_end"), 3),
            fixed(f.get(f"{name}_sft_end"), 3),
            "±" + fixed(f.get(f"{name}_band"), 3),
            count(f.get(f"{name}_seconds")),
            verdict(f, name),
        ]
        for name in families(f)
    ]
    plot = "![eval pass@1 against step, RL and SFT, every seed](images/tasks_pass_at_1.png)"
    return join(setup, table(HEADER, rows), plot, provenance(f))
