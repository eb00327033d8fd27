"""deploy/fleet_sim.py: the simulated fleet against numbers worked out by hand (an
engine-bound fixed fleet's throughput), and the elastic fleet's behaviour under a load step
against fixed fleets on the same work: it grows in the step and shrinks after it, stays in
its bounds, keeps the learner busier than one replica does, and the staleness window is
never overrun. Small worlds: the whole file runs in a few seconds."""

from __future__ import annotations

import math

import pytest

from common.fleet import ElasticConfig
from deploy.fleet_sim import compare, main, simulate
from deploy.fleet_sim_model import Fleet, Learner, Workload
from envservers.latency import LoadStep

STEP_FROM_S, STEP_FOR_S = 300.0, 300.0


def _workload(**overrides) -> Workload:
    """3 turns of 200 tokens; one replica of 16 slots decodes 1,000 tokens/s (a turn takes
    3.2 s); tools median 0.5 s, x10 from 300 s to 600 s."""
    fields = dict(
        turns_per_episode=3,
        tokens_per_turn=200,
        replica_tokens_per_s=1000,
        engine_slots=16,
        tool_median_s=0.5,
        tool_p99_s=2.0,
        load_step=LoadStep(10.0, STEP_FROM_S, STEP_FOR_S),
        tool_timeout_s=60.0,
    )
    return Workload(**(fields | overrides))


def _learner(**overrides) -> Learner:
    """8 groups of 4 per step, bound 3: a window of 32 groups, 4 per replica, so 8 replicas
    at most are useful."""
    fields = dict(
        train_s_per_step=6.0, prompts_per_step=8, group_size=4, max_staleness=3, total_steps=150
    )
    return Learner(**(fields | overrides))


ELASTIC = ElasticConfig(
    enabled=True,
    min_replicas=1,
    max_replicas=8,
    scale_up_after_s=10,
    scale_down_after_s=60,
    engine_start_s=20,
    poll_s=5,
)


@pytest.fixture(scope="module")
def runs():
    return compare(_workload(), _learner(), ELASTIC, engine_start_s=20, seed=1)


def test_an_engine_bound_fixed_fleet_generates_at_its_engines_throughput():
    """Tools of a millisecond and a learner step of 10 ms: two replicas of 1,000 tokens/s
    make a step's 8 x 4 x 2 x 100 = 6,400 tokens every 3.2 s, so 40 steps take
    10 s (engines starting) + 40 x 3.2 s = 138 s."""
    workload = _workload(
        turns_per_episode=2,
        tokens_per_turn=100,
        tool_median_s=0.001,
        tool_p99_s=0.002,
        load_step=None,
    )
    learner = _learner(train_s_per_step=0.01, total_steps=40)
    fleet = Fleet(ElasticConfig(), replicas=2, engine_start_s=10.0)
    summary = simulate(workload, learner, fleet).summary
    assert summary.steps == 40
    assert summary.run_s == pytest.approx(10 + 40 * 3.2, rel=0.03)
    assert summary.replica_s == pytest.approx(2 * summary.run_s)
    trained_tokens = 40 * 8 * 4 * 2 * 100
    assert trained_tokens <= summary.tokens_generated <= trained_tokens + 32 * 4 * 2 * 100


def test_the_elastic_fleet_grows_in_the_load_step_and_shrinks_after_it(runs):
    samples = runs["elastic 1-8"].samples
    before = max(s.replicas for s in samples if STEP_FROM_S - 100 <= s.t < STEP_FROM_S)
    during = max(s.replicas for s in samples if STEP_FROM_S < s.t <= STEP_FROM_S + STEP_FOR_S)
    end = samples[-1].replicas
    assert before < during
    assert end < during
    assert runs["elastic 1-8"].summary.handbacks > 0  # it shrank while groups were in flight


@pytest.mark.parametrize("label", ["elastic 1-8", "fixed 8", "fixed 1"])
def test_every_fleet_stays_in_its_bounds_and_finishes_the_run(runs, label):
    result = runs[label]
    counts = [s.replicas for s in result.samples]
    low, high = (1, 8) if label.startswith("elastic") else (int(label.split()[1]),) * 2
    assert min(counts) == low and max(counts) == high
    assert all(s.replicas_ready <= s.replicas for s in result.samples)
    assert result.summary.steps == 150


def test_the_elastic_fleet_keeps_the_learner_busier_in_the_step_than_one_replica(runs):
    elastic, single = runs["elastic 1-8"].summary, runs["fixed 1"].summary
    assert elastic.learner_idle_frac_during_step < single.learner_idle_frac_during_step - 0.1
    assert elastic.run_s < single.run_s
    assert elastic.replica_hours < runs["fixed 8"].summary.replica_hours


@pytest.mark.parametrize("label", ["elastic 1-8", "fixed 8", "fixed 1"])
def test_the_staleness_window_is_filled_and_never_overrun(runs, label):
    """released - trained - dropped <= (k + 1) P at every release, and the work the fleet
    is sized by (released - finished) never above it either."""
    summary = runs[label].summary
    assert summary.window_limit == (3 + 1) * 8
    assert summary.window_peak == summary.window_limit
    assert max(s.work for s in runs[label].samples) <= summary.window_limit


def test_a_seed_fixes_the_run_and_another_seed_changes_it():
    def run(seed):
        return simulate(_workload(), _learner(total_steps=30), Fleet(ELASTIC), seed=seed).summary

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_the_learner_idle_fraction_is_its_waits_over_the_run():
    """With engines that are never the bottleneck (64 replicas' worth of tokens for one
    step's work) the learner waits only for the first groups: one turn (3.2 s) after the
    engines are ready, then trains back to back."""
    workload = _workload(tool_median_s=0.001, tool_p99_s=0.002, load_step=None)
    learner = _learner(total_steps=20, max_staleness=3, train_s_per_step=6.0)
    fleet = Fleet(ElasticConfig(), replicas=8, engine_start_s=10.0)
    summary = simulate(workload, learner, fleet).summary
    first_batch_s = 10 + 3 * 3.2  # engine start, then three turns (tools of a millisecond)
    assert summary.run_s == pytest.approx(first_batch_s + 20 * 6.0, abs=0.1)
    assert summary.learner_idle_frac == pytest.approx(first_batch_s / summary.run_s, abs=0.01)
    assert summary.learner_idle_frac_during_step is None


def test_the_command_line_prints_each_fleet(capsys):
    main(
        [
            "--replicas-max",
            "4",
            "--steps",
            "5",
            "--prompts-per-step",
            "8",
            "--group-size",
            "4",
            "--engine-slots",
            "16",
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0:2] for line in lines[2:]] == [
        ["elastic", "1-4"],
        ["fixed", "4"],
        ["fixed", "1"],
    ]
    assert math.isfinite(float(lines[2].split()[2]))
