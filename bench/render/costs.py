"""Renderer of bench/results/make_bench.json (written by bench/runner.py at the end of
`make bench`): each script's wall time and the load it ran under, and the total against the
budget."""

from __future__ import annotations

from bench.render.markdown import Figures, check, fixed, join, minutes, provenance, table

BUDGET_S = 45 * 60


def make_bench(f: Figures) -> str:
    names = str(f.get("scripts", "")).split()
    rows = [
        [
            f"`bench/{name}.py`",
            minutes(f.get(f"{name}_s")),
            f"{fixed(f.get(f'{name}_load_avg_1m_before'), 1)} →"
            f" {fixed(f.get(f'{name}_load_avg_1m_after'), 1)}",
        ]
        for name in names
    ]
    rows.append(["**total**", f"**{minutes(f.get('total_s'))}**", ""])
    header = ["script", "wall time", "1-minute load average, before → after"]
    target = check("`make bench` in all", f.get("total_s"), BUDGET_S, "<=", minutes)
    return join(table(header, rows), target, provenance(f))
