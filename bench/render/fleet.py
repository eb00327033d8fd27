"""Figures the elastic_sim block computes from the simulator's results: what the elastic
fleet saves against the fixed fleet at its most, and the replicas whose generation keeps
pace with the learner (against which the size the fleet settles at is read)."""

from __future__ import annotations

from bench.render.formats import Figures, numbers


def pace_replicas(f: Figures) -> float | None:
    """Replicas whose engines, full, generate a step's tokens in one learner step."""
    names = ("turns_per_episode", "tokens_per_turn", "group_size", "train_s_per_step",
             "replica_tokens_per_s")  # fmt: skip
    values = [f.get(f"calib_{name}") for name in names] + [f.get("prompts_per_step")]
    if not numbers(*values):
        return None
    turns, tokens, group, train_s, rate, prompts = values
    return prompts * group * turns * tokens / (train_s * rate)


def elastic_sim(f: Figures) -> dict[str, float | None]:
    """The elastic fleet's replica-hours saved and its run's change in length, as fractions
    of the fixed fleet at its most; None (no reading) unless the table has every figure."""
    names = ("elastic_replica_hours", "fixed_max_replica_hours", "elastic_run_s",
             "fixed_max_run_s", "elastic_learner_idle_frac_during_step",
             "fixed_max_learner_idle_frac_during_step", "elastic_replicas_end")  # fmt: skip
    values = [f.get(name) for name in names]
    if not numbers(*values):
        return {"saving": None, "run_change": None, "pace": None}
    elastic, most, run, most_run = values[:4]
    return {
        "saving": 1 - elastic / most,
        "run_change": run / most_run - 1,
        "pace": pace_replicas(f),
    }
