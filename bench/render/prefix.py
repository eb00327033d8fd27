"""Renderer of bench/prefix_sharing.py's figures: step time and memory of the dense packed
path ("current"), boundary-respecting attention without sharing, and shared-prefix training."""

from __future__ import annotations

from bench.render.markdown import MISSING, Figures, check, count, fixed, join, provenance, table

# (key infix, label): the variants the script writes, in the order of the tables.
VARIANTS = (
    ("current", "dense packed (current), {current} tokens"),
    ("current_8192", "dense packed (current), 8,192 tokens (memory only)"),
    ("unshared_1024", "unshared, 1,024 tokens"),
    ("shared_1024", "shared, 1,024 tokens"),
    ("unshared", "unshared, {budget} tokens"),
    ("shared", "shared, {budget} tokens"),
)
WORKLOADS = (("demo", "demo"), ("synthetic", "long shared prompt"))


def prefix_sharing(f: Figures) -> str:
    setup = (
        f"Micro-batch budget {count(f.get('budget'))} tokens for the segment paths and"
        f" {count(f.get('current_budget'))} for the dense packed path; best of"
        f" {f.get('repeats', MISSING)}, torch on {f.get('torch_threads', MISSING)} thread(s)."
    )
    ratio = f.get("unshared_tokens_per_s_ratio_8192_vs_1024")
    target = check(
        "unshared tokens/s at 8,192-token micro-batches over 1,024", ratio, 0.9, ">=", fixed
    )
    return join(setup, _steps(f), _speedups(f), target, provenance(f))


def _label(f: Figures, template: str) -> str:
    return template.format(budget=count(f.get("budget")), current=count(f.get("current_budget")))


def _steps(f: Figures) -> str:
    rows = []
    for workload, name in WORKLOADS:
        for variant, template in VARIANTS:
            prefix = f"{workload}_{variant}"
            if not any(key.startswith(prefix + "_") for key in f):
                continue
            rows.append(
                [
                    name,
                    _label(f, template),
                    fixed(f.get(f"{prefix}_step_s"), 2),
                    count(f.get(f"{prefix}_peak_rss_mib")),
                    count(f.get(f"{prefix}_step_rss_growth_mib")),
                ]
            )
    header = ["workload", "variant, micro-batch budget", "step s", "peak RSS MiB", "growth MiB"]
    return table(header, rows)


def _speedups(f: Figures) -> str:
    rows = [
        [
            name,
            f"{count(f.get(f'{w}_tokens_unshared'))} / {count(f.get(f'{w}_tokens_shared'))}",
            f"{fixed(f.get(f'{w}_speedup_shared_vs_current'))}x",
            f"{fixed(f.get(f'{w}_speedup_shared_vs_unshared'))}x",
            f"{fixed(f.get(f'{w}_speedup_unshared_vs_current'))}x",
        ]
        for w, name in WORKLOADS
    ]
    header = [
        "workload",
        "tokens unshared / shared",
        "shared vs current",
        "shared vs unshared",
        "unshared vs current",
    ]
    return table(header, rows)
