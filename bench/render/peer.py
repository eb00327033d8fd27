"""Renderer of bench/peer_trl.py's figures: pass@1 of both sides' checkpoints
against steps and seconds from launch, time to the target, the ratio against its target, and
where each side's step goes (every `tether_*_per_step_s` and `trl_*_per_step_s` key)."""

from __future__ import annotations

import re

from bench.render.markdown import MISSING, Figures, check, fixed, join, percent, provenance, table

SIDES = (("trl", "TRL"), ("tether", "Tether"))
RATIO_TARGET = 0.5


def peer_trl(f: Figures) -> str:
    target = f.get("target_pass1", 0.8)
    setup = (
        f"{f.get('steps', MISSING)} steps per side; pass@1 by the shared evaluator on"
        f" {f.get('eval_prompts', MISSING)} prompts x {f.get('eval_samples', MISSING)} samples;"
        f" TRL's torch on {f.get('trl_torch_threads', MISSING)} thread(s), Tether with"
        f" {f.get('tether_actor_replicas', MISSING)} actor replica(s); target pass@1 {target}."
    )
    ratio = check(
        "**ratio** (Tether's time to target / TRL's, from launch)",
        f.get("ratio"),
        RATIO_TARGET,
        "<=",
        fixed,
    )
    return join(
        setup,
        _curve(f),
        _summary(f, target),
        ratio + "\n" + _startup_reading(f, target),
        _breakdown(f),
        provenance(f),
    )


def _target_key(target: object) -> str:
    return f"{target:g}".replace(".", "p") if isinstance(target, int | float) else "0p8"


def _steps(f: Figures) -> list[int]:
    pattern = r"(?:trl|tether)_pass1_step(\d+)|tether_inrun_pass1_v(\d+)"
    found = {int(m.group(1) or m.group(2)) for key in f if (m := re.fullmatch(pattern, key))}
    return sorted(found | {0})


def _curve(f: Figures) -> str:
    rows = []
    for step in _steps(f):
        cells = [str(step)]
        for side, _ in SIDES:
            pass1 = f.get("pass1_start") if step == 0 else f.get(f"{side}_pass1_step{step:02d}")
            cells += [fixed(pass1, 3), fixed(f.get(f"{side}_t_step{step:02d}_s"), 0)]
        cells.append(fixed(f.get(f"tether_inrun_pass1_v{step:02d}"), 3))
        rows.append(cells)
    header = ["step", "TRL pass@1", "TRL s from launch", "Tether pass@1", "Tether s from launch"]
    return table(header + ["Tether in-run eval"], rows)


def _summary(f: Figures, target: object) -> str:
    key = _target_key(target)
    rows = [
        ["s per step (steady state)", *_sides(f, "{side}_per_step_s", 2)],
        ["start-up, s", *_sides(f, "{side}_startup_s", 0)],
        ["whole run, s", *_sides(f, "{side}_wall_s", 0)],
        [
            f"**to pass@1 {target} from launch**, s",
            *_sides(f, "{side}_time_to_pass1_" + key + "_s", 0),
        ],
        [
            f"to pass@1 {target} after start-up, s",
            *_sides(f, "{side}_time_to_pass1_" + key + "_after_startup_s", 0),
        ],
    ]
    return table(["figure", "TRL", "Tether"], rows)


def _sides(f: Figures, template: str, places: int) -> list[str]:
    return [fixed(f.get(template.format(side=side)), places) for side, _ in SIDES]


def _startup_reading(f: Figures, target: object) -> str:
    """What the ratio's target asks of Tether's time from launch, against its start-up."""
    trl = f.get(f"trl_time_to_pass1_{_target_key(target)}_s")
    startup = f.get("tether_startup_s")
    if not isinstance(trl, float) or not isinstance(startup, float):
        return ""
    allowed = RATIO_TARGET * trl
    verdict = "above" if startup > allowed else "below"
    return (
        f"- The target asks Tether to reach {target} within {fixed(allowed, 0)} s of launch;"
        f" its start-up alone took {fixed(startup, 0)} s, {verdict} that."
    )


def _breakdown(f: Figures) -> str:
    rows = []
    for side, label in SIDES:
        parts = sorted(
            (m.group(1), f[key])
            for key in f
            if (m := re.fullmatch(side + r"_(\w+)_per_step_s", key))
            and m.group(1) != "engine_busy"
            and not m.group(1).startswith("time")
        )
        rows += [[label, part.replace("_", " "), fixed(value, 2)] for part, value in parts]
        if parts:
            total = sum(value for _, value in parts)
            rows.append([label, "sum of the parts", fixed(total, 2)])
        rows.append([label, "**s per step**", f"**{fixed(f.get(f'{side}_per_step_s'), 2)}**"])
    engine = [
        f"- Tether's engines had a generation in flight {percent(f.get('tether_engine_busy_frac'))}"
        f" of the time ({fixed(f.get('tether_engine_busy_per_step_s'))} s per step each).",
        _learner_reading(f.get("tether_learner_wait_frac")),
        f"- An in-run eval took {fixed(f.get('tether_eval_s'), 1)} s from its version to its"
        f" record ({f.get('tether_num_evals', MISSING)} evals).",
    ]
    return join(table(["side", "part of a step", "s per step"], rows), "\n".join(engine))


def _learner_reading(wait_frac: object) -> str:
    if not isinstance(wait_frac, float):
        return "- The learner's wait for data was not recorded."
    who = "the learner is the bottleneck" if wait_frac < 0.1 else "generation holds it up"
    return f"- Tether's learner waited for data {percent(wait_frac, 1)} of the time: {who}."
