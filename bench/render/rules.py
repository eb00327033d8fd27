"""Renderer of bench/token_rule.py: the staleness rule per token against per group on the
30 s-tail tool workload, by bound, over seeds."""

from __future__ import annotations

from bench.render.markdown import Figures, count, fixed, join, percent, table

RULES = (("group", "group (drop a group with any stale token)"),
         ("token", "token (clear stale tokens' loss)"))  # fmt: skip
HEADER = [
    "bound",
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


def _bounds(f: Figures) -> list[int]:
    """The bounds measured: `b<bound>_group_stale_groups_mean` present."""
    return sorted(int(k.split("_")[0][1:]) for k in f
                  if k.startswith("b") and k.endswith("_group_stale_groups_mean"))  # fmt: skip


def _provenance(f: Figures, bound: int) -> str:
    """When and under what load one bound's runs were measured (bounds are measured apart)."""
    before, after = f.get(f"b{bound}_load_avg_1m_before"), f.get(f"b{bound}_load_avg_1m_after")
    load = "load average not recorded"
    if isinstance(before, int | float) and isinstance(after, int | float):
        load = f"1-minute load average {before:.1f} before and {after:.1f} after"
    when = f.get(f"b{bound}_measured_at", "at an unrecorded time")
    return f"- bound {bound}: measured {when}, {load}"


def token_rule(f: Figures) -> str:
    bounds = _bounds(f)
    setup = (
        f"`make run`'s job, {count(f.get('steps'))} steps at each bound (above 1 with the"
        " proximal anchor and TIS), every calculator call first waiting a log-normal latency"
        f" (median {count(f.get('tool_median_ms'))} ms, p99 {fixed(f.get('tool_p99_s'), 0)} s);"
        f" {count(f.get('seeds'))} seeds (the tool latencies' draw), the two rules back to back"
        " per seed. Means over the seeds, the range in brackets; each bound's runs in one"
        " invocation."
    )
    rows = [
        [
            str(bound),
            label,
            _range(f, f"b{bound}_{rule}_stale_groups", lambda v: fixed(v, 1)),
            _range(f, f"b{bound}_{rule}_generated_per_trained", lambda v: fixed(v, 2)),
            _range(f, f"b{bound}_{rule}_s_per_step", lambda v: fixed(v, 2)),
            _range(f, f"b{bound}_{rule}_masked_fraction", lambda v: percent(v, 1)),
            _range(f, f"b{bound}_{rule}_pass_at_1", lambda v: fixed(v, 3)),
        ]
        for bound in bounds
        for rule, label in RULES
    ]
    image = "![token_rule by bound](images/token_rule.png)" if len(bounds) > 1 else ""
    provenances = "\n".join(_provenance(f, bound) for bound in bounds)
    written = (f"_Results written {f.get('measured_at', 'at an unrecorded time')} on"
               f" {f.get('machine', 'an unrecorded machine')}; each bound's runs:_")  # fmt: skip
    return join(setup, table(HEADER, rows), image, written + "\n\n" + provenances)
