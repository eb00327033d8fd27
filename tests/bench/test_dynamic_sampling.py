"""bench/dynamic_sampling.py's figures of one run, on records made by hand."""

from __future__ import annotations

import pytest

from bench import dynamic_sampling
from bench.tether_run import RunRecord


def _record(evals: list[tuple[int, float, float]], filtered: list[int]) -> RunRecord:
    run = RunRecord(run_dir=None, wall_s=90.0)
    run.records = [{"kind": "eval", "version": v, "pass_at_1": p, "t": t} for v, p, t in evals] + [
        {"kind": "train", "version": i + 1, "filtered_groups": f} for i, f in enumerate(filtered)
    ]
    return run


def test_a_run_s_pass_at_1_time_to_target_and_filtered_share():
    run = _record([(0, 0.4, 20.0), (10, 0.8, 45.0), (15, 0.86, 52.0), (30, 0.9, 80.0)], [2, 0, 2])
    figures = dynamic_sampling.run_figures(run, prompts_per_step=8)
    assert figures["pass_at_1_v10"] == 0.8 and figures["pass_at_1_v30"] == 0.9
    assert figures["s_to_target"] == 52.0  # the first eval at or above 0.85
    assert figures["filtered_share"] == pytest.approx(4 / (4 + 24))
    assert figures["wall_s"] == 90.0


def test_a_run_that_never_reaches_the_target_is_missing_not_zero():
    figures = dynamic_sampling.run_figures(_record([(0, 0.4, 20.0)], [0]), prompts_per_step=8)
    assert figures["s_to_target"] is None and figures["pass_at_1_v10"] is None
    runs = [figures, {**figures, "s_to_target": 60.0}]
    assert dynamic_sampling.mean_of(runs, "s_to_target") == 60.0
    assert dynamic_sampling.mean_of([figures], "s_to_target") is None
