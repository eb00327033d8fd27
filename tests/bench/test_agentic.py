"""bench/agentic.py's pure parts and its block of docs/benchmarks.md (bench/render/agentic.py),
on figures made by hand. Nothing here runs a benchmark or asserts a speed."""

from __future__ import annotations

import math

import pytest

from bench import agentic as bench
from bench.render import agentic as render


def test_modes_above_bound_one_carry_the_correction_and_caps_their_cap():
    assert bench.MODES["sync"].overrides() == []
    assert bench.MODES["b1"].overrides() == []
    assert bench.MODES["b2"].overrides() == bench.CORRECTION
    assert bench.MODES["b1-cap8"].overrides() == ["actor.max_groups_in_flight=8"]
    assert bench.MODES["b2-cap8"].overrides() == [*bench.CORRECTION, "actor.max_groups_in_flight=8"]
    for workload in bench.WORKLOADS.values():
        assert workload.modes[0] == "sync"  # every speedup has its baseline
        assert set(workload.modes) <= set(bench.MODES) == set(render.MODES)


def test_speedups_are_over_the_workloads_own_sync_run():
    measured = {"sync": {"s_per_step": 8.0}, "b2": {"s_per_step": 2.0, "pass_at_1": 0.5}}
    assert bench.with_speedups(measured) == {
        "sync_s_per_step": 8.0,
        "sync_speedup": 1.0,
        "b2_s_per_step": 2.0,
        "b2_speedup": 4.0,
        "b2_pass_at_1": 0.5,
    }
    assert "b2_speedup" not in bench.with_speedups({"b2": {"s_per_step": 2.0}})


def _figures(**changes) -> dict:
    figures = {"steps": 12, "agentic_tool_median_ms": 500.0, "agentic_tool_p99_s": 8.0}
    runs = {
        "tools_b1-cap8": (2.0, 1.0, 1, 0.6),
        "tools_b1": (2.0, 1.0, 1, 0.6),
        "agentic_sync": (8.0, 1.0, 0, 0.6),
        "agentic_b4": (2.5, 3.2, 4, 0.62),
    }
    for key, (s_per_step, speedup, staleness, pass_at_1) in runs.items():
        figures.update(
            {
                f"{key}_s_per_step": s_per_step,
                f"{key}_speedup": speedup,
                f"{key}_max_staleness_seen": staleness,
                f"{key}_pass_at_1": pass_at_1,
                f"{key}_learner_idle_frac": 0.5,
                f"{key}_actor_idle_frac": 0.5,
            }
        )
    figures.update(changes)
    return figures


def test_the_block_has_a_row_per_run_and_the_default_in_bold():
    text = render.agentic(_figures())
    assert (
        "| agentic: 500 ms / 8 s | **bound 4 + TIS** | 2.50 | 3.20x | 0.50 | 0.50 | 4 | 0.620 |"
        in text
    )
    assert text.count("| tools: ") == 2 and "agentic-30s" not in text


def test_the_targets_on_both_sides():
    met = render.targets(_figures())
    assert met.count("**met**") == 3 and "within the 95% band" in met
    missed = render.targets(
        _figures(
            agentic_b4_speedup=2.5,
            agentic_b4_max_staleness_seen=5,
            tools_b1_s_per_step=2.2,
            agentic_b4_pass_at_1=0.3,
        )
    )
    assert missed.count("**missed**") == 3 and "**outside** the 95% band" in missed


def test_the_pass_at_1_band_is_that_of_a_difference_of_two_binomials():
    assert render.pass_at_1_band(0.5, 0.5, 128) == pytest.approx(1.96 * math.sqrt(0.5 / 128))


def test_the_gpu_model_per_workload_from_its_sync_run():
    sync_parts = {"wait_data": 6.0, "train": 0.4, "broadcast": 0.1, "engine_busy": 1.0}
    figures = _figures(**{f"agentic_sync_{k}_s_per_step": v for k, v in sync_parts.items()})
    text = render.agentic(figures)
    # G + T = 6.5 s, max(T, E) = 1.0 s
    assert "- agentic: synchronous 6.50 s per step, asynchronous 1.00 s: **6.50x**" in text
    assert "GPU model" not in render.agentic(_figures())


def test_no_runs_says_so():
    assert "no runs" in render.agentic({"steps": 12})
