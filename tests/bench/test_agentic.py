"""bench/agentic.py's pure parts, on figures made by hand (its block of docs/benchmarks.md is
checked in test_render_docs.py). Nothing here runs a benchmark or asserts a speed."""

from __future__ import annotations

from bench import agentic as bench


def test_modes_above_bound_one_carry_the_correction_and_caps_their_cap():
    assert bench.MODES["sync"].overrides() == []
    assert bench.MODES["b1"].overrides() == []
    assert bench.MODES["b2"].overrides() == bench.CORRECTION
    assert bench.MODES["b1-cap8"].overrides() == ["actor.max_groups_in_flight=8"]
    assert bench.MODES["b2-cap8"].overrides() == [*bench.CORRECTION, "actor.max_groups_in_flight=8"]
    for workload in bench.WORKLOADS.values():
        assert workload.modes[0] == "sync"  # every speedup has its baseline
        assert set(workload.modes) <= set(bench.MODES)


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
