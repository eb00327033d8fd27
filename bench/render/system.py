"""Figures the system benchmarks' blocks compute from their results (the actor, async and
its GPU model, staleness, profile_steps, scale): ratios, sums and orderings only; the
templates in docs/benchmarks/ write them."""

from __future__ import annotations

import math

from bench.profile_support import SPIN, WAITING
from bench.render.formats import Figures, matches, numbers, prefixed


def actor(f: Figures) -> dict[str, float | None]:
    """The two shares the actor's reading rests on: its own CPU (client, env server,
    nats-server) over the engine's, per token; env steps over an episode's wall time."""
    engine = f.get("actor_cpu_s_per_1k_tokens_engine")
    own = [f.get(f"actor_cpu_s_per_1k_tokens_{part}") for part in ("client", "env", "nats_server")]
    wall, env = f.get("episode_wall_s_mean"), f.get("episode_env_s_mean")
    return {
        "own_cpu_share": sum(own) / engine if numbers(engine, *own) else None,
        "env_share": env / wall if numbers(wall, env) else None,
    }


def async_speedup(f: Figures) -> dict[str, float | None]:
    """The learner's training time per step, asynchronous over synchronous."""
    sync_train, async_train = f.get("sync_train_s_per_step"), f.get("async_train_s_per_step")
    return {"training_slowdown": async_train / sync_train if numbers(sync_train, async_train)
            else None}  # fmt: skip


def async_gpu_model(f: Figures) -> dict[str, float | None]:
    """T of the GPU model (bench/async_support.py's gpu_model): the synchronous run's train
    and broadcast seconds per step; None when a term of the model is missing."""
    parts = (f.get("sync_train_s_per_step"), f.get("sync_broadcast_s_per_step"))
    terms = (f.get("sync_wait_data_s_per_step"), f.get("sync_engine_busy_s_per_step"), *parts)
    return {"learner_s": sum(parts) if numbers(*terms) else None}


def staleness(f: Figures) -> dict[str, object]:
    """The staleness table's k's, and its readings: each correction's largest loss against
    the first k, the k's where TIS and decoupled PPO differ, and one figure's sampling
    error (a binomial's standard error at the first k's pass@1)."""
    ks = matches(f, r"pass1_k([0-9]+)_none_mean")
    largest_loss = {}
    for correction in ("none", "tis", "decoupled"):
        means = [f.get(f"pass1_k{k}_{correction}_mean") for k in ks]
        largest_loss[correction] = (
            max(means[0] - m for m in means) if ks and numbers(*means) else None
        )
    differ = [k for k in ks if f.get(f"pass1_k{k}_tis_mean") != f.get(f"pass1_k{k}_decoupled_mean")]
    n = f.get("eval_prompts", 0) * f.get("eval_samples", 0)
    p = f.get(f"pass1_k{ks[0]}_none_mean") if ks else None
    error = None
    if n and numbers(p):
        error = {"p": p, "n": n, "error": math.sqrt(p * (1 - p) / n)}
    return {"ks": ks, "largest_loss": largest_loss, "differ": differ, "sampling_error": error}


PROFILE_LABELS = ("before", "after")


def profile_steps(f: Figures) -> dict[str, object]:
    """Per role (keys `<label>|<role>|<category>`): its categories, the largest in the
    `after` revision first; its running seconds per step (waits left out) per revision;
    and the sums the highlights quote, per revision."""

    def total(label: str, role: str, categories: tuple[str, ...]) -> float:
        values = (f.get(f"{label}|{role}|{category}") for category in categories)
        return sum(value for value in values if numbers(value))

    def work(label: str, role: str) -> float:
        values = prefixed(f, f"{label}|{role}|")
        return sum(v for c, v in values.items() if c != WAITING and numbers(v))

    def after_first(role: str, category: str) -> tuple[float, str]:
        value = f.get(f"after|{role}|{category}")
        return (-value if numbers(value) else 0.0, category)

    def categories(role: str) -> list[str]:
        names = {key.split("|")[2] for key in f if key.count("|") == 2
                 and key.split("|")[0] in PROFILE_LABELS and key.split("|")[1] == role}  # fmt: skip
        return sorted(names, key=lambda category: after_first(role, category))

    roles = ("learner", "actor", "engine")
    return {
        "categories": {role: categories(role) for role in roles},
        "work": {role: [work(label, role) for label in PROFILE_LABELS] for role in roles},
        "spin": [total(label, "engine", (SPIN,)) for label in PROFILE_LABELS],
        "engine_forward": [total(label, "engine", ("model forward",)) for label in PROFILE_LABELS],
        "learner_forward_backward": [
            total(label, "learner", ("forward", "backward")) for label in PROFILE_LABELS
        ],
    }


def scale(f: Figures) -> dict[str, object]:
    """The sizes of the ladder (keys `<size>/<figure>`) by parameters, and each size's
    learner peak over its allowance: 1.3 x the training state (weights, gradients and
    AdamW's two moments: 4 x the weights) plus the bare loop's activations."""
    sizes = {key.split("/")[0] for key in f if "/" in key}
    allowance = {}
    for size in sizes:
        g = prefixed(f, f"{size}/")
        if numbers(g.get("weights_gb"), g.get("bare_activation_gb"), g.get("learner_peak_gb")):
            state_gb = 4 * g["weights_gb"]
            allowance[size] = g["learner_peak_gb"] / (1.3 * state_gb + g["bare_activation_gb"])
    ordered = sorted(sizes, key=lambda size: (f.get(f"{size}/params", 0), size))
    return {"sizes": ordered, "allowance": allowance}


PEER_RATIO_TARGET = 0.5
"""Tether's time to the target pass@1 over TRL's, both from launch."""


def peer_trl(f: Figures) -> dict[str, object]:
    """The steps with a pass@1 on either side (and 0, the start); the key of the target's
    times; the seconds from launch the ratio's target allows Tether; and each side's parts
    of a step (every `<side>_*_per_step_s` but engine busy, a share, not a part)."""
    target = f.get("target_pass1", 0.8)
    target_key = f"{target:g}".replace(".", "p") if numbers(target) else "0p8"
    steps = {0, *matches(f, r"(?:trl|tether)_pass1_step([0-9]+)"),
             *matches(f, r"tether_inrun_pass1_v([0-9]+)")}  # fmt: skip
    trl, startup = f.get(f"trl_time_to_pass1_{target_key}_s"), f.get("tether_startup_s")
    parts = {
        side: sorted(
            (part, f[f"{side}_{part}_per_step_s"])
            for part in matches(f, side + r"_(\w+)_per_step_s")
            if part != "engine_busy" and not part.startswith("time")
        )
        for side in ("trl", "tether")
    }
    return {
        "ratio_target": PEER_RATIO_TARGET,
        "target_key": target_key,
        "steps": sorted(steps),
        "allowed_s": PEER_RATIO_TARGET * trl if numbers(trl, startup) else None,
        "parts": parts,
    }
