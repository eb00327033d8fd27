"""Renderer of bench/episode_resume.py: an actor replica killed mid-episode, with turn-level
episode checkpoints and as before them, on the same work."""

from __future__ import annotations

from bench.render.markdown import Figures, check, count, fixed, join, provenance, table

MODES = (("before", "before (played from the first token)"), ("checkpoints", "checkpoints"))
HEADER = [
    "a killed replica's task",
    "unfinished samples continued",
    "of them resumed from their last turn",
    "policy tokens taken over",
    "tokens generated again",
    "seconds from the kill to the task's last trajectory",
]


def episode_resume(f: Figures) -> str:
    setup = (
        f"One prompt task of {f.get('group_size', '—')} samples on two replicas with real vLLM"
        " engines (the shipped warm-start model), the calculator env server's tool calls"
        " waiting ~1.5 s; the replica holding the task SIGKILLed when the first of its"
        " episodes has recorded a turn. `before`: its checkpoints purged as it dies, so"
        " the other replica plays the task as before this change. Medians of"
        f" {f.get('trials', '—')} interleaved trials; the seconds include the prompt ack wait"
        " (4 s here)."
    )
    rows = [
        [
            label,
            count(f.get(f"{mode}_samples_continued")),
            count(f.get(f"{mode}_samples_resumed")),
            count(f.get(f"{mode}_tokens_saved")),
            count(f.get(f"{mode}_tokens_regenerated")),
            fixed(f.get(f"{mode}_seconds_kill_to_done"), 1),
        ]
        for mode, label in MODES
    ]
    target = check(
        "tokens generated again, checkpoints over before",
        f.get("tokens_regenerated_ratio"),
        0.0,
        "<=",
        lambda v: fixed(v, 2),
    )
    return join(setup, table(HEADER, rows), target, provenance(f))
