"""Projection to GPU scale: arithmetic on stated assumptions, not a measurement. The
assumptions are the constants below and are rendered beside every figure computed from
them, so the doc's projection comes from this code, not from hand-typed numbers."""

from __future__ import annotations

import math
from statistics import NormalDist

from bench.render.markdown import Figures, fixed, join, percent, table

# Models (parameter counts of the Qwen2.5 sizes).
MODELS = (("1.5B", 1.54e9), ("7B", 7.62e9), ("32B", 32.76e9))
BF16_BYTES = 2
# Inter-node: one NIC per GPU at this many Gb/s, reaching this share of line rate.
NIC_GBIT_S = 400
NIC_EFFICIENCY = 0.8
NVLINK_GB_S = 300  # inside an H100 NVLink node
# A GRPO step: samples x tokens, 6 N FLOP per token (forward + backward) on GPUS H100s.
STEP_SAMPLES, STEP_TOKENS_PER_SAMPLE = 512, 4096
FLOP_PER_PARAM_TOKEN = 6
GPUS, PEAK_TFLOP_S, MFU = 8, 989, 0.4
# Staleness: the demo's samples per prompt, and the share of groups we accept to lose.
GROUP_SIZE = 8
LOST_GROUPS = 0.01
DEMO_GENERATION_P99_S = 2.0  # assumed p99 of a demo episode's generation, tools aside
# (workload, model of the step time, assumed p99 of a group's duration in seconds)
SCENARIOS = (
    ("7B, 2-turn episodes, tools of median 50 ms / p99 2 s, 1K-token responses", "7B", 40),
    ("7B, 30-turn episodes, tools of median 1 s / p99 30 s, 8K-token response tails", "7B", 600),
    ("32B, the same episodes", "32B", 900),
)


def inter_node_gb_s() -> float:
    return NIC_GBIT_S / 8 * NIC_EFFICIENCY


def step_tokens() -> int:
    return STEP_SAMPLES * STEP_TOKENS_PER_SAMPLE


def step_s(params: float) -> float:
    """Seconds of one training step: 6 N D FLOP over the GPUs' sustained FLOP/s."""
    return FLOP_PER_PARAM_TOKEN * params * step_tokens() / (GPUS * PEAK_TFLOP_S * 1e12 * MFU)


def weights(_: Figures) -> str:
    assumptions = (
        f"Assumed: bf16 weights ({BF16_BYTES} bytes per parameter); broadcast at"
        f" {fixed(inter_node_gb_s(), 0)} GB/s between nodes (one {NIC_GBIT_S} Gb/s NIC per GPU"
        f" at {percent(NIC_EFFICIENCY)} of line rate) and {NVLINK_GB_S} GB/s inside an NVLink"
        f" node; a step of {STEP_SAMPLES} x {STEP_TOKENS_PER_SAMPLE} ="
        f" {fixed(step_tokens() / 1e6, 1)} M tokens at {FLOP_PER_PARAM_TOKEN} N FLOP per token"
        f" on {GPUS} H100 at {PEAK_TFLOP_S} TFLOP/s bf16 dense and {percent(MFU)} MFU."
    )
    rows, shares = [], []
    for name, params in MODELS:
        gb = params * BF16_BYTES / 1e9
        between, step = gb / inter_node_gb_s(), step_s(params)
        shares.append(between / step)
        rows.append(
            [
                f"{name} ({fixed(params / 1e9, 2)}B parameters)",
                f"{fixed(gb, 1)} GB",
                f"{fixed(between, 2)} s",
                f"{fixed(gb / NVLINK_GB_S, 3)} s",
                f"{fixed(step, 0)} s",
            ]
        )
    header = ["model", "bf16 weight bytes", "broadcast, between nodes", "inside a node", "step"]
    low, high = percent(min(shares), 1), percent(max(shares), 1)
    reading = f"Broadcast between nodes as a share of a step: {low}" + (
        " at every size (bytes and FLOP both grow with N)." if low == high else f" to {high}."
    )
    return join(assumptions, table(header, rows), reading)


def slowest_of(group_size: int, median_s: float, p99_s: float) -> tuple[float, float]:
    """p99 of the slowest of `group_size` log-normal latencies of the given median and p99,
    and the standard-normal quantile it sits at (the 0.99^(1/G) quantile of one call)."""
    sigma = (math.log(p99_s) - math.log(median_s)) / NormalDist().inv_cdf(0.99)
    z = NormalDist().inv_cdf((1 - LOST_GROUPS) ** (1 / group_size))
    return median_s * math.exp(z * sigma), z


def staleness_needed(p99_group_s: float, step_time_s: float) -> int:
    """The bound k that gives a group k + 1 step times: ceil(p99 / T) - 1."""
    return max(0, math.ceil(p99_group_s / step_time_s) - 1)


def staleness(f: Figures) -> str:
    median_s = f.get("tool_latency_median_ms", 50.0) / 1e3
    p99_s = f.get("tool_latency_p99_s", 2.0)
    tail, z = slowest_of(GROUP_SIZE, median_s, p99_s)
    demo_t = f.get("async_s_per_step")
    reading = (
        f"With bench/async.py's tool latency (median {fixed(median_s * 1e3, 0)} ms, p99"
        f" {fixed(p99_s, 1)} s) the slowest of {GROUP_SIZE} one-call episodes has a p99 of"
        f" exp(mu + {fixed(z)} sigma) = {fixed(tail, 1)} s of tool time alone (the"
        f" {1 - LOST_GROUPS}^(1/{GROUP_SIZE}) quantile of one call). Groups lost to staleness:"
        f" at most {percent(LOST_GROUPS)}."
    )
    rows = []
    if isinstance(demo_t, float):
        demo_group = DEMO_GENERATION_P99_S + tail
        rows.append(
            [
                "this demo with bench/async.py's tool latency (CPU; T measured there)",
                f"{fixed(demo_t, 1)} s",
                f"{fixed(DEMO_GENERATION_P99_S, 0)} s generation + {fixed(tail, 1)} s tool tail",
                str(staleness_needed(demo_group, demo_t)),
            ]
        )
    steps = {name: step_s(params) for name, params in MODELS}
    for workload, model, group_s in SCENARIOS:
        rows.append(
            [
                workload,
                f"{fixed(steps[model], 0)} s",
                f"{fixed(group_s, 0)} s",
                str(staleness_needed(group_s, steps[model])),
            ]
        )
    header = ["workload", "step time T", "p99 group duration (assumed)", "k needed"]
    return join(reading, table(header, rows))
