"""Renderers of the system benchmarks run on `make run` itself or on real engines:
bench/async.py (and its GPU model), bench/staleness.py and bench/weightsync.py."""

from __future__ import annotations

import math
import re

from bench.render.markdown import (
    MISSING,
    Figures,
    check,
    count,
    fixed,
    join,
    percent,
    provenance,
    scaled,
    table,
)

CORRECTIONS = (("none", "none (PPO vs behaviour)"), ("tis", "TIS"), ("decoupled", "decoupled PPO"))


def async_speedup(f: Figures) -> str:
    setup = (
        f"{f.get('steps', MISSING)} learner steps per mode, {f.get('actor_replicas', MISSING)}"
        f" actor replica(s), asynchronous bound {f.get('async_max_staleness', MISSING)}; every"
        f" tool call first waits a log-normal latency of median"
        f" {fixed(f.get('tool_latency_median_ms'), 0)} ms and p99"
        f" {fixed(f.get('tool_latency_p99_s'), 1)} s."
    )
    rows = [
        ["seconds per step", *_modes(f, "s_per_step", fixed)],
        [
            "learner: waiting for data / training / broadcasting, s per step",
            *[
                " / ".join(
                    fixed(f.get(f"{m}_{k}_s_per_step")) for k in ("wait_data", "train", "broadcast")
                )
                for m in ("sync", "async")
            ],
        ],
        ["**learner idle fraction**", *_modes(f, "learner_idle_frac", _three)],
        [
            f"engine busy, s per step (each of {f.get('actor_replicas', MISSING)})",
            *_modes(f, "engine_busy_s_per_step", fixed),
        ],
        [
            "**actor idle fraction** (no generation in the engine)",
            *_modes(f, "actor_idle_frac", _three),
        ],
        ["trained tokens/s", *_modes(f, "trained_tokens_per_s", count)],
        ["generated tokens/s", *_modes(f, "generated_tokens_per_s", count)],
        ["largest staleness trained on", *_modes(f, "max_staleness_seen", str)],
    ]
    header = ["figure", "sync (`max_staleness = 0`)", "async"]
    targets = "\n".join(
        [
            check("speedup (sync s per step / async)", f.get("speedup"), 2.5, ">=", _times),
            check("learner idle fraction, async", f.get("learner_idle_frac"), 0.1, "<", _three),
            check("actor idle fraction, async", f.get("actor_idle_frac"), 0.1, "<", _three),
        ]
    )
    sync_train, async_train = f.get("sync_train_s_per_step"), f.get("async_train_s_per_step")
    slowdown = ""
    if isinstance(sync_train, float) and isinstance(async_train, float):
        slowdown = (
            "The learner's training time per step, asynchronous over synchronous (the same"
            f" step with the engines generating beside it): {_times(async_train / sync_train)}."
        )
    return join(setup, table(header, rows), targets, slowdown, provenance(f))


def _modes(f: Figures, key: str, show) -> list[str]:
    return [show(f.get(f"{mode}_{key}", MISSING)) for mode in ("sync", "async")]


def _three(value: object) -> str:
    return fixed(value, 3)


def _times(value: object) -> str:
    return f"{fixed(value)}x"


def async_gpu_model(f: Figures) -> str:
    """The GPU model's arithmetic, shown term by term from the synchronous run's parts."""
    g = f.get("sync_wait_data_s_per_step")
    parts = (f.get("sync_train_s_per_step"), f.get("sync_broadcast_s_per_step"))
    e = f.get("sync_engine_busy_s_per_step")
    if not all(isinstance(v, int | float) for v in (g, e, *parts)):
        return "The synchronous run's parts are missing from bench/results/async.json."
    t = sum(parts)
    return "\n".join(
        [
            f"- G = {fixed(g)} s, T = {fixed(t)} s, E = {fixed(e)} s per step.",
            f"- Synchronous: G + T = {fixed(f.get('model_gpu_sync_s_per_step'))} s per step;"
            f" asynchronous: max(T, E) = {fixed(f.get('model_gpu_async_s_per_step'))} s.",
            f"- **Modelled speedup {_times(f.get('model_gpu_speedup'))}**; learner idle"
            f" {percent(f.get('model_gpu_learner_idle_frac'))}, engines idle"
            f" {percent(f.get('model_gpu_actor_idle_frac'))}.",
        ]
    )


def staleness(f: Figures) -> str:
    ks = sorted(
        {int(m.group(1)) for key in f if (m := re.fullmatch(r"pass1_k(\d+)_none_mean", key))}
    )
    setup = (
        f"{f.get('steps', MISSING)} steps = {f.get('trained_samples', MISSING)} trained samples"
        f" per run, {f.get('seeds', MISSING)} seeds, eval on {f.get('eval_prompts', MISSING)}"
        f" prompts x {f.get('eval_samples', MISSING)} samples; all runs took"
        f" {fixed(_minutes(f.get('seconds')), 1)} minutes. pass@1, mean ± std over the seeds"
        f" [min, max]; {fixed(f.get('pass1_start'), 3)} at the start."
    )
    rows = [[str(k)] + [_cell(f, k, c) for c, _ in CORRECTIONS] for k in ks]
    header = ["k (batches exactly k versions old)"] + [label for _, label in CORRECTIONS]
    return join(setup, table(header, rows), _staleness_reading(f, ks), provenance(f))


def _minutes(value_s: object) -> object:
    return value_s / 60 if isinstance(value_s, int | float) else None


def _cell(f: Figures, k: int, correction: str) -> str:
    key = f"pass1_k{k}_{correction}"
    return (
        f"{fixed(f.get(key + '_mean'), 3)} ± {fixed(f.get(key + '_std'), 3)}"
        f" [{fixed(f.get(key + '_min'), 3)}, {fixed(f.get(key + '_max'), 3)}]"
    )


def _staleness_reading(f: Figures, ks: list[int]) -> str:
    """Readings computed from the table: the largest loss against k = 0 per correction,
    whether TIS and decoupled differ anywhere, and one figure's sampling error."""
    lines = []
    for correction, label in CORRECTIONS:
        means = [f.get(f"pass1_k{k}_{correction}_mean") for k in ks]
        if ks and all(isinstance(m, float) for m in means):
            lines.append(
                f"- {label}: largest loss against k = {ks[0]}:"
                f" {fixed(max(means[0] - m for m in means), 3)}."
            )
    differ = [k for k in ks if f.get(f"pass1_k{k}_tis_mean") != f.get(f"pass1_k{k}_decoupled_mean")]
    lines.append(
        f"- TIS and decoupled PPO differ in {len(differ)} of {len(ks)} rows"
        + (f" (k = {', '.join(map(str, differ))})." if differ else ".")
    )
    n = f.get("eval_prompts", 0) * f.get("eval_samples", 0)
    p = f.get(f"pass1_k{ks[0]}_none_mean") if ks else None
    if n and isinstance(p, float):
        lines.append(
            f"- Sampling error of one pass@1 figure near {fixed(p)} on {n} samples:"
            f" sqrt(p (1 - p) / n) = {fixed(math.sqrt(p * (1 - p) / n), 3)}."
        )
    return "\n".join(lines)


def weightsync(f: Figures) -> str:
    setup = (
        f"A random Qwen2 of {fixed(scaled(f.get('model_params'), 1e-6), 1)} M parameters,"
        f" {fixed(scaled(f.get('weight_bytes'), 1e-6), 1)} MB of fp32 weights,"
        f" {f.get('rounds', MISSING)} rounds per K; medians over rounds."
    )
    rows = [
        [
            "loopback, one TCP stream, MB/s",
            fixed(scaled(f.get("loopback_bytes_per_s"), 1e-6), 0),
            "",
        ],
        [
            "broadcast, MB/s",
            *_per_k(f, lambda k: fixed(scaled(f.get(f"broadcast_bytes_per_s_k{k}"), 1e-6), 0)),
        ],
        [
            "sender's transfer (group set-up + buckets), ms",
            *_per_k(f, lambda k: fixed(f.get(f"transfer_ms_k{k}"), 0)),
        ],
        ["**ratio_vs_loopback**", *_per_k(f, lambda k: fixed(f.get(f"ratio_vs_loopback_k{k}")))],
        [
            "generation stall per update (longest token gap), ms",
            *_per_k(f, lambda k: fixed(f.get(f"stall_ms_k{k}"), 0)),
        ],
        [
            "engine's account: pause / receive / load, ms",
            *_per_k(
                f,
                lambda k: " / ".join(
                    fixed(f.get(f"engine_{p}_ms_k{k}"), 0) for p in ("pause", "receive", "load")
                ),
            ),
        ],
        [
            "decode step (median token gap before the update), ms",
            *_per_k(f, lambda k: fixed(f.get(f"decode_step_ms_k{k}"), 1)),
        ],
    ]
    targets = "\n".join(
        [
            check(
                "ratio_vs_loopback (the smaller K's)", f.get("ratio_vs_loopback"), 0.5, ">=", fixed
            ),
            check("stall in decode steps", f.get("stall_in_decode_steps"), 2, "<=", _one),
        ]
    )
    return join(setup, table(["figure", "K = 1", "K = 2"], rows), targets, provenance(f))


def _per_k(f: Figures, show) -> list[str]:
    return [show(k) for k in (1, 2)]


def _one(value: object) -> str:
    return fixed(value, 1)
