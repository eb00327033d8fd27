"""Figures the blocks of the staleness bounds compute (agentic, auto_bound): bench/async.py's
GPU model per workload, speedups and bounds over seeds, and whether two evals' pass@1 differ
by more than sampling explains. Also the bound the agentic block calls the default."""

from __future__ import annotations

import math
from statistics import fmean

from bench.async_support import gpu_model
from bench.render.formats import Figures, numbers

DEFAULT_BOUND = 4
"""The bound (with TIS) docs/running.md recommends for tool-heavy configs: the agentic
block's default, and the bound bench/elastic_sim.py plans with."""
WORKLOADS = ("tools", "agentic", "agentic-30s")
SYNC_PARTS = ("wait_data_s_per_step", "train_s_per_step", "broadcast_s_per_step",
              "engine_busy_s_per_step")  # fmt: skip
EVAL_SAMPLES = {"agentic": 64 * 2, "demo": 100 * 2}
"""Samples per eval: bench/agentic.py's (64 prompts x 2), configs/demo.toml's (100 x 2)."""
AUTO_WORKLOADS = ("instant", "tools", "agentic", "demo")


def pass_at_1_band(p: float, q: float, n: int) -> float:
    """Half-width of the 95% band of the difference of two pass@1 estimates of `n`
    samples each (normal approximation)."""
    return 1.96 * math.sqrt((p * (1 - p) + q * (1 - q)) / n)


def agentic(f: Figures) -> dict[str, object]:
    """The GPU model of each workload whose synchronous run has every part; the default's
    pass@1 gap to sync and its band; today's workload's step sized by the engine over the
    fixed cap's."""
    models = {}
    for workload in WORKLOADS:
        sync = {key: f.get(f"{workload}_sync_{key}") for key in SYNC_PARTS}
        if numbers(*sync.values()):
            models[workload] = gpu_model(sync)
    sync_pass, default_pass = (
        f.get("agentic_sync_pass_at_1"),
        f.get(f"agentic_b{DEFAULT_BOUND}_pass_at_1"),
    )
    gap = band = None
    if numbers(sync_pass, default_pass):
        gap = abs(default_pass - sync_pass)
        band = pass_at_1_band(sync_pass, default_pass, EVAL_SAMPLES["agentic"])
    sized, capped = f.get("tools_b1_s_per_step"), f.get("tools_b1-cap8_s_per_step")
    today = sized / capped if numbers(sized) and numbers(capped) and capped else None
    return {
        "workloads": WORKLOADS,
        "default_bound": DEFAULT_BOUND,
        "gpu_models": models,
        "gap": gap,
        "band": band,
        "eval_samples": EVAL_SAMPLES["agentic"],
        "today": today,
    }


def auto_bound(f: Figures) -> dict[str, object]:
    """Each workload's seeds; auto's speedups as means over them; the highest bound auto
    reached with instant tools; auto's end pass@1 against a fixed bound's, within the band
    of their difference over all the seeds' samples or not."""
    seeds = {w: list(range(int(n))) if numbers(n := f.get(f"{w}_seeds")) else []
             for w in AUTO_WORKLOADS}  # fmt: skip

    def mean(workload: str, mode: str, figure: str) -> float | None:
        values = [f.get(f"{workload}_{mode}_s{seed}_{figure}") for seed in seeds[workload]]
        values = [value for value in values if numbers(value)]
        return fmean(values) if values else None

    def gap(workload: str, baseline: str) -> dict[str, object] | None:
        auto, other = mean(workload, "auto", "pass_at_1"), mean(workload, baseline, "pass_at_1")
        if auto is None or other is None:
            return None
        samples = EVAL_SAMPLES[workload] * len(seeds[workload])
        band = pass_at_1_band(auto, other, samples)
        return {"auto": auto, "other": other, "band": band, "samples": samples,
                "met": abs(auto - other) <= band}  # fmt: skip

    bounds = [f.get(f"instant_auto_s{seed}_bounds") for seed in seeds["instant"]]
    reached = [max(int(b) for b in s.split(",")) for s in bounds if isinstance(s, str) and s]
    return {
        "seeds": seeds,
        "agentic_speedup": mean("agentic", "auto", "speedup"),
        "tools_speedup": mean("tools", "auto", "speedup"),
        "instant_highest_bound": max(reached) if reached else None,
        "agentic_gap": gap("agentic", "sync"),
        "demo_gap": gap("demo", "b1"),
    }
