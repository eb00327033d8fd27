"""Renderer of bench/profile_steps.py's figures: for the revision before and
after, the running seconds per training step of the learner, the actor replica and the vLLM
engine, by category (keys `<label>|<role>|<category>`)."""

from __future__ import annotations

from bench.profile_support import SPIN, WAITING
from bench.render.markdown import MISSING, Figures, fixed, join, provenance, table

LABELS = ("before", "after")
ROLES = (("learner", "learner"), ("actor", "actor replica"), ("engine", "vLLM engine"))


def profile_steps(f: Figures) -> str:
    revisions = ", ".join(f"{label} = `{f.get(f'{label}_rev', MISSING)}`" for label in LABELS)
    setup = (
        f"py-spy at {f.get('rate_hz', MISSING)} Hz over {fixed(f.get('window_s'), 0)} s of a"
        f" `make run` from its step {f.get('from_step', 3)}, each revision's own demo config;"
        f" {revisions}. Seconds"
        " per training step that each role's Python threads spent running, by what they ran"
        " (a role waits the rest of the step)."
    )
    step_rows = [
        [
            "s per step",
            *(fixed(f.get(f"{label}_s_per_step")) for label in LABELS),
        ],
        [
            "steps in the window",
            *(fixed(f.get(f"{label}_steps_in_window"), 1) for label in LABELS),
        ],
    ]
    return join(
        setup,
        table(["", *LABELS], step_rows),
        *(_role(f, role, name) for role, name in ROLES),
        _highlights(f),
        provenance(f),
    )


def _work(f: Figures, label: str, role: str) -> float:
    """A role's running seconds per step, waits left out."""
    return sum(
        value
        for key, value in f.items()
        if key.startswith(f"{label}|{role}|")
        and key != f"{label}|{role}|{WAITING}"
        and isinstance(value, int | float)
    )


def _both(f: Figures, role: str, *categories: str) -> str:
    values = [
        sum(
            value
            for category in categories
            if isinstance(value := f.get(f"{label}|{role}|{category}"), int | float)
        )
        for label in LABELS
    ]
    return " → ".join(fixed(v) for v in values)


def _highlights(f: Figures) -> str:
    steps = " → ".join(fixed(f.get(f"{label}_s_per_step")) for label in LABELS)
    works = {
        role: " → ".join(fixed(_work(f, label, role)) for label in LABELS) for role, _ in ROLES
    }
    lines = [
        f"- Seconds per step, before → after: {steps}.",
        f"- vLLM's worker processes spinning on their shared-memory queue between steps:"
        f" {_both(f, 'engine', SPIN)} s per step (every engine), against"
        f" {_both(f, 'engine', 'model forward')} s of model forward.",
        f"- The learner's forward and backward: {_both(f, 'learner', 'forward', 'backward')}"
        f" s per step; all its work: {works['learner']} s per step.",
        f"- The engine's work: {works['engine']} s per step; the actor replica's own:"
        f" {works['actor']} s per step.",
    ]
    return "\n".join(lines)


def _role(f: Figures, role: str, name: str) -> str:
    categories = {
        key.split("|")[2]
        for key in f
        if key.count("|") == 2 and key.split("|")[1] == role and key.split("|")[0] in LABELS
    }

    def after_first(category: str) -> tuple[float, str]:
        value = f.get(f"after|{role}|{category}")
        return (-value if isinstance(value, int | float) else 0.0, category)

    rows = [
        [category, *(fixed(f.get(f"{label}|{role}|{category}")) for label in LABELS)]
        for category in sorted(categories, key=after_first)
    ]
    totals = [_work(f, label, role) for label in LABELS]
    rows.append(["**working in all** (waits left out)", *(f"**{fixed(t)}**" for t in totals)])
    return table([f"{name}: running s per step", *LABELS], rows) if categories else ""
