"""Renderer of bench/token_rule.py: the staleness rule per token against per group on the
30 s-tail tool workload, over seeds."""

from __future__ import annotations

from bench.render.markdown import Figures, count, fixed, join, percent, provenance, table

RULES = (("group", "group (drop a group with any stale token)"),
         ("token", "token (clear stale tokens' loss)"))  # fmt: skip
HEADER = [
    "rule",
    "groups dropped as stale",
    "policy tokens generated per token trained",
    "s per step",
    "loss tokens cleared",
    "end pass@1",
]


def _range(f: Figures, name: str, show) -> str:
    return (
        f"{show(f.get(name + '_mean'))} ({show(f.get(name + '_min'))}-{show(f.get(name + '_max'))})"
    )


def token_rule(f: Figures) -> str:
    setup = (
        f"`make run`'s job, {count(f.get('steps'))} steps at bound {count(f.get('bound'))} with"
        " the proximal anchor and TIS, every calculator call first waiting a log-normal"
        f" latency (median {count(f.get('tool_median_ms'))} ms, p99"
        f" {fixed(f.get('tool_p99_s'), 0)} s); {count(f.get('seeds'))} seeds (the tool"
        " latencies' draw), the two rules back to back per seed. Means over the seeds, the"
        " range in brackets."
    )
    rows = [
        [
            label,
            _range(f, f"{rule}_stale_groups", lambda v: fixed(v, 1)),
            _range(f, f"{rule}_generated_per_trained", lambda v: fixed(v, 2)),
            _range(f, f"{rule}_s_per_step", lambda v: fixed(v, 2)),
            _range(f, f"{rule}_masked_fraction", lambda v: percent(v, 1)),
            _range(f, f"{rule}_pass_at_1", lambda v: fixed(v, 3)),
        ]
        for rule, label in RULES
    ]
    return join(setup, table(HEADER, rows), provenance(f))
