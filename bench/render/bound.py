"""Renderer of bench/auto_bound.py: an "auto" staleness bound against fixed bounds, per
workload and seed, with its targets (speedup, pass@1 band, bound reached) computed from
the figures."""

from __future__ import annotations

from math import sqrt
from statistics import fmean

from bench.render.markdown import Figures, check, fixed, join, provenance, table

WORKLOADS = (
    ("instant", "calculator answers at once", ("b1", "auto")),
    ("tools", "tool calls median 50 ms, p99 2 s", ("b1", "auto")),
    ("agentic", "tool calls median 0.5 s, p99 8 s", ("sync", "auto", "b4")),
    ("demo", "`make run` as shipped", ("b1", "auto")),
)
EVAL_SAMPLES = {"agentic": 64 * 2, "demo": 100 * 2}
"""Samples per eval: bench/agentic.py's evals, configs/demo.toml's."""
HEADER = ["workload", "steps", "mode", "seed", "s per step", "speedup", "bound by step",
          "learner idle", "end pass@1"]  # fmt: skip


def _seeds(f: Figures, workload: str) -> range:
    seeds = f.get(f"{workload}_seeds")
    return range(int(seeds)) if isinstance(seeds, int | float) else range(0)


def _rows(f: Figures) -> list[list[str]]:
    rows = []
    for workload, label, modes in WORKLOADS:
        for mode in modes:
            for seed in _seeds(f, workload):
                key = f"{workload}_{mode}_s{seed}_"
                if key + "s_per_step" not in f:
                    continue
                rows.append([label, fixed(f.get(f"{workload}_steps"), 0), mode, str(seed),
                             fixed(f.get(key + "s_per_step"), 2),
                             fixed(f.get(key + "speedup"), 2) + "x",
                             str(f.get(key + "bounds", "")),
                             fixed(f.get(key + "learner_idle_frac"), 2),
                             fixed(f.get(key + "pass_at_1"), 3)])  # fmt: skip
    return rows


def _mean(f: Figures, workload: str, mode: str, figure: str) -> float | None:
    values = [f.get(f"{workload}_{mode}_s{seed}_{figure}") for seed in _seeds(f, workload)]
    values = [v for v in values if isinstance(v, int | float)]
    return fmean(values) if values else None


def _highest_bound(f: Figures, workload: str) -> float | None:
    """The highest bound an auto run of `workload` reached, over seeds."""
    bounds = [f.get(f"{workload}_auto_s{seed}_bounds") for seed in _seeds(f, workload)]
    reached = [max(int(b) for b in s.split(",")) for s in bounds if isinstance(s, str) and s]
    return max(reached) if reached else None


def _pass_at_1_gap(f: Figures, workload: str, baseline: str, label: str) -> str:
    """auto's mean end pass@1 against `baseline`'s, with the 95% binomial band of that
    difference over the evals' samples (one eval a seed)."""
    auto = _mean(f, workload, "auto", "pass_at_1")
    other = _mean(f, workload, baseline, "pass_at_1")
    if auto is None or other is None:
        return f"- {label}, end pass@1 against {baseline}: not measured"
    samples = EVAL_SAMPLES[workload] * len(_seeds(f, workload))
    band = 1.96 * sqrt(auto * (1 - auto) / samples + other * (1 - other) / samples)
    verdict = "**met**" if abs(auto - other) <= band else "**missed**"
    return (
        f"- {label}, end pass@1, auto {fixed(auto, 3)} against {baseline} {fixed(other, 3)}"
        f" (means over seeds): a difference of {auto - other:+.3f}, target within the 95% band"
        f" of ±{band:.3f} ({samples} samples each): {verdict}"
    )


def auto_bound(f: Figures) -> str:
    setup = (
        '`make run`\'s job with `learner.max_staleness = "auto"` (limit 4) against fixed'
        " bounds, each workload's runs in one invocation; the fixed bounds above 1 with the"
        " proximal anchor and TIS. `speedup` is the workload's synchronous run's"
        " (or bound 1's) seconds per step over this run's; `bound by step` is the bound in"
        " force for each step."
    )
    targets = "\n".join([
        check("0.5 s / 8 s, auto's speedup over synchronous (mean over seeds)",
              _mean(f, "agentic", "auto", "speedup"), 3.0, ">=", lambda v: fixed(v, 2)),
        _pass_at_1_gap(f, "agentic", "sync", "0.5 s / 8 s"),
        check("50 ms / 2 s, auto's speed relative to bound 1 (mean over seeds)",
              _mean(f, "tools", "auto", "speedup"), 1.0, ">=", lambda v: fixed(v, 2)),
        check("instant tools, the highest bound auto reached",
              _highest_bound(f, "instant"), 2, "<=", lambda v: fixed(v, 0)),
        _pass_at_1_gap(f, "demo", "b1", "`make run` as shipped (auto) against bound 1"),
    ])  # fmt: skip
    return join(setup, table(HEADER, _rows(f)), targets, provenance(f))
