"""Renderer of bench/token_rule.py: the staleness rule per token against per group on the
30 s-tail tool workloads (the demo's question and demo/chain.py's chains), by bound, over
seeds."""

from __future__ import annotations

from bench.render.markdown import Figures, count, fixed, join, percent, table

RULES = (("group", "group (drop a group with any stale token)"),
         ("token", "token (clear stale tokens' loss)"))  # fmt: skip
# Key prefix of each workload's figures, and what its episodes are.
WORKLOADS = (
    ("", "calculator (1 call, 2 turns)"),
    ("chain_", "chain (3 calls, 4 turns)"),
    ("chainslow_", "chain (3 calls, 4 turns)"),
    ("chainlong_", "chain (3 calls, 4 turns)"),
)
HEADER = [
    "workload",
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


def _measured(f: Figures) -> list[tuple[str, str, int]]:
    """(prefix, workload, bound) measured: `<prefix>b<bound>_group_stale_groups_mean` present."""
    found = []
    for prefix, workload in WORKLOADS:
        for key in f:
            head = key[len(prefix) :].split("_")[0]
            if key.startswith(prefix) and key.endswith("_group_stale_groups_mean") and \
                    head[:1] == "b" and head[1:].isdigit():  # fmt: skip
                found.append((prefix, workload, int(head[1:])))
    return sorted(found, key=lambda m: (WORKLOADS.index((m[0], m[1])), m[2]))


def _latency(f: Figures, prefix: str, bound: int, name: str):
    return f.get(f"{prefix}b{bound}_tool_{name}", f.get(f"tool_{name}"))


def _provenance(f: Figures, prefix: str, workload: str, bound: int) -> str:
    """When and under what load one bound's runs were measured (bounds are measured apart)."""
    key = f"{prefix}b{bound}"
    before, after = f.get(f"{key}_load_avg_1m_before"), f.get(f"{key}_load_avg_1m_after")
    load = "load average not recorded"
    if isinstance(before, int | float) and isinstance(after, int | float):
        load = f"1-minute load average {before:.1f} before and {after:.1f} after"
    when = f.get(f"{key}_measured_at", "at an unrecorded time")
    where = f.get(f"{key}_machine", f.get("machine", "an unrecorded machine"))
    median = count(_latency(f, prefix, bound, "median_ms"))
    name = workload.split(" ")[0]
    return f"- {name} with {median} ms tools, bound {bound}: measured {when} on {where}, {load}"


def token_rule(f: Figures) -> str:
    measured = _measured(f)
    setup = (
        f"`make run`'s job (or the same on demo/chain.py's rows and warm start),"
        f" {count(f.get('steps'))} steps at each bound (above 1 with the"
        " proximal anchor and TIS), every calculator call first waiting a log-normal latency"
        f" (its median in the first column, p99 {fixed(_latency(f, '', 2, 'p99_s'), 0)} s);"
        f" {count(f.get('seeds'))} seeds (the tool latencies' draw), the two rules back to back"
        " per seed. Means over the seeds, the range in brackets; each bound's runs in one"
        " invocation."
    )
    rows = [
        [
            f"{workload}; tool median {count(_latency(f, prefix, bound, 'median_ms'))} ms",
            str(bound),
            label,
            _range(f, f"{prefix}b{bound}_{rule}_stale_groups", lambda v: fixed(v, 1)),
            _range(f, f"{prefix}b{bound}_{rule}_generated_per_trained", lambda v: fixed(v, 2)),
            _range(f, f"{prefix}b{bound}_{rule}_s_per_step", lambda v: fixed(v, 2)),
            _range(f, f"{prefix}b{bound}_{rule}_masked_fraction", lambda v: percent(v, 1)),
            _range(f, f"{prefix}b{bound}_{rule}_pass_at_1", lambda v: fixed(v, 3)),
        ]
        for prefix, workload, bound in measured
        for rule, label in RULES
    ]
    image = "![token_rule by bound](images/token_rule.png)" if len(measured) > 1 else ""
    provenances = "\n".join(_provenance(f, *m) for m in measured)
    written = (f"_Results written {f.get('measured_at', 'at an unrecorded time')} on"
               f" {f.get('machine', 'an unrecorded machine')}; each workload and bound's"
               " runs:_")  # fmt: skip
    return join(setup, table(HEADER, rows), image, written + "\n\n" + provenances)
