"""Projection to GPU scale: arithmetic on stated assumptions, not a measurement. The
assumptions are the constants below; the templates projection-weights and
projection-staleness show them (as `projection.NAME`) beside every figure computed from
them, so the doc's projection comes from this code, not from hand-typed numbers."""

from __future__ import annotations

import math
from statistics import NormalDist

from bench.render.formats import Figures, numbers

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


def slowest_of(group_size: int, median_s: float, p99_s: float) -> tuple[float, float]:
    """p99 of the slowest of `group_size` log-normal latencies of the given median and p99,
    and the standard-normal quantile it sits at (the 0.99^(1/G) quantile of one call)."""
    sigma = (math.log(p99_s) - math.log(median_s)) / NormalDist().inv_cdf(0.99)
    z = NormalDist().inv_cdf((1 - LOST_GROUPS) ** (1 / group_size))
    return median_s * math.exp(z * sigma), z


def staleness_needed(p99_group_s: float, step_time_s: float) -> int:
    """The bound k that gives a group k + 1 step times: ceil(p99 / T) - 1."""
    return max(0, math.ceil(p99_group_s / step_time_s) - 1)


def weights(_: Figures) -> dict[str, object]:
    """Per model: its bf16 bytes, the broadcast's seconds between nodes and inside one, the
    step's seconds, and the broadcast's share of the step."""
    models = []
    for name, params in MODELS:
        weight_gb = params * BF16_BYTES / 1e9
        between, step = weight_gb / inter_node_gb_s(), step_s(params)
        models.append({"name": name, "params": params, "weight_gb": weight_gb,
                       "between_nodes_s": between, "inside_node_s": weight_gb / NVLINK_GB_S,
                       "step_s": step, "broadcast_share": between / step})  # fmt: skip
    return {"models": models}


def staleness(f: Figures) -> dict[str, object]:
    """The slowest of a group's tool calls at bench/async.py's latency, and the bound each
    workload needs: this demo's (when bench/async.py measured its step time) and the
    assumed GPU scenarios'."""
    median_s = f.get("tool_latency_median_ms", 50.0) / 1e3
    p99_s = f.get("tool_latency_p99_s", 2.0)
    tail_s, z = slowest_of(GROUP_SIZE, median_s, p99_s)
    demo = None
    if numbers(demo_step_s := f.get("async_s_per_step")):
        k = staleness_needed(DEMO_GENERATION_P99_S + tail_s, demo_step_s)
        demo = {"step_s": demo_step_s, "k": k}
    steps = {name: step_s(params) for name, params in MODELS}
    scenarios = [
        {"workload": workload, "step_s": steps[model], "group_s": group_s,
         "k": staleness_needed(group_s, steps[model])}
        for workload, model, group_s in SCENARIOS
    ]  # fmt: skip
    return {"median_s": median_s, "p99_s": p99_s, "tail_s": tail_s, "z": z, "demo": demo,
            "scenarios": scenarios}  # fmt: skip
