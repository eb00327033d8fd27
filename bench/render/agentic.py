"""The "agentic" block of docs/benchmarks.md: bench/agentic.py's runs, one row each, and
the targets read from them: the speedup at the recommended bound, the staleness it trained
on, the engine-sized work in flight against the fixed cap, the pass@1 band."""

from __future__ import annotations

import math

from bench.async_support import gpu_model
from bench.render.markdown import MISSING, Figures, check, fixed, join, provenance, table

WORKLOADS = ("tools", "agentic", "agentic-30s")
MODES = {
    "sync": "sync (bound 0)",
    "b1-cap8": "bound 1, fixed cap 8 groups",
    "b1": "bound 1",
    "b2-cap8": "bound 2 + TIS, fixed cap 8 groups",
    "b2": "bound 2 + TIS",
    "b4": "bound 4 + TIS",
}
SYNC_PARTS = (
    "wait_data_s_per_step",
    "train_s_per_step",
    "broadcast_s_per_step",
    "engine_busy_s_per_step",
)
DEFAULT, DEFAULT_BOUND = "b4", 4
"""The bound and correction docs/running.md recommends for tool-heavy configs."""


def agentic(f: Figures) -> str:
    setup = (
        f"{f.get('steps', MISSING)} learner steps per run, one actor replica; work in flight"
        " sized by the engine's room unless a fixed cap is named; pass@1 of the eval after"
        " the last step (64 prompts x 2 samples). Speedup: the workload's sync seconds per"
        " step / the run's."
    )
    header = [
        "tools (median / p99)",
        "mode",
        "s per step",
        "speedup",
        "learner idle",
        "actor idle",
        "largest staleness",
        "pass@1",
    ]
    rows = []
    for workload in WORKLOADS:
        latency = (
            f"{workload}: {fixed(f.get(f'{workload}_tool_median_ms'), 0)} ms /"
            f" {fixed(f.get(f'{workload}_tool_p99_s'), 0)} s"
        )
        for mode, label in MODES.items():
            key = f"{workload}_{mode}"
            if f"{key}_s_per_step" not in f:
                continue
            rows.append(
                [
                    latency,
                    f"**{label}**" if mode == DEFAULT else label,
                    fixed(f.get(f"{key}_s_per_step")),
                    _times(f.get(f"{key}_speedup")),
                    fixed(f.get(f"{key}_learner_idle_frac")),
                    fixed(f.get(f"{key}_actor_idle_frac")),
                    str(f.get(f"{key}_max_staleness_seen", MISSING)),
                    fixed(f.get(f"{key}_pass_at_1"), 3),
                ]
            )
    if not rows:
        return "bench/results/agentic.json has no runs."
    return join(setup, table(header, rows), targets(f), gpu_models(f), provenance(f))


def gpu_models(f: Figures) -> str:
    """bench/async.py's GPU model per workload, from its synchronous run's parts."""
    lines = []
    for workload in WORKLOADS:
        sync = {key: f.get(f"{workload}_sync_{key}") for key in SYNC_PARTS}
        if not all(isinstance(v, int | float) for v in sync.values()):
            continue
        model = gpu_model(sync)
        lines.append(
            f"- {workload}: synchronous {fixed(model['model_gpu_sync_s_per_step'])} s per step,"
            f" asynchronous {fixed(model['model_gpu_async_s_per_step'])} s:"
            f" **{_times(model['model_gpu_speedup'])}**"
        )
    if not lines:
        return ""
    return "\n".join(
        [
            "GPU model (learner and engines on separate devices, a bound that hides every tool"
            " tail; **a model, not a measurement**):"
        ]
        + lines
    )


def targets(f: Figures) -> str:
    default = f"agentic_{DEFAULT}"
    sync_pass, default_pass = f.get("agentic_sync_pass_at_1"), f.get(f"{default}_pass_at_1")
    gap = band = None
    if isinstance(sync_pass, float) and isinstance(default_pass, float):
        gap, band = abs(default_pass - sync_pass), pass_at_1_band(sync_pass, default_pass, 128)
    today = _ratio(f.get("tools_b1_s_per_step"), f.get("tools_b1-cap8_s_per_step"))
    lines = [
        check(
            f"speedup of the agentic workload at the default ({MODES[DEFAULT]})",
            f.get(f"{default}_speedup"),
            3.0,
            ">=",
            _times,
        ),
        check(
            f"largest staleness trained on, at the default's bound {DEFAULT_BOUND}",
            f.get(f"{default}_max_staleness_seen"),
            DEFAULT_BOUND,
            "<=",
            lambda v: fixed(v, 0),
        ),
        check(
            "today's workload (50 ms / 2 s), s per step sized by the engine / fixed cap 8",
            today,
            1.05,
            "<=",
            lambda v: fixed(v, 3),
        ),
    ]
    if gap is not None:
        verdict = "within" if gap <= band else "**outside**"
        lines.append(
            f"- pass@1 at equal steps, default vs sync: {fixed(default_pass, 3)} vs"
            f" {fixed(sync_pass, 3)}, a gap of {fixed(gap, 3)}: {verdict} the 95% band of two"
            f" 128-sample binomials ({fixed(band, 3)})"
        )
    return "\n".join(lines)


def pass_at_1_band(p: float, q: float, n: int) -> float:
    """Half-width of the 95% band of the difference of two pass@1 estimates of `n`
    samples each (normal approximation)."""
    return 1.96 * math.sqrt((p * (1 - p) + q * (1 - q)) / n)


def _ratio(a: object, b: object) -> float | None:
    if isinstance(a, int | float) and isinstance(b, int | float) and b:
        return a / b
    return None


def _times(value: object) -> str:
    return f"{fixed(value)}x" if isinstance(value, int | float) else MISSING
