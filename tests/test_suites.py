"""The test budget (tests/suites.toml) and its verdict: a suite past its share is named in
every `make test` table and fails under `--strict`, and the shares cannot quietly outgrow
the total."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.suites import Budget, Outcome, Suite, load_budget, verdict

REPO = Path(__file__).resolve().parents[1]


def _suite(*, name: str = "main", share_s: float = 600.0, in_make_test: bool = True) -> Suite:
    return Suite(name=name, args=["tests"], share_s=share_s, buys="x", in_make_test=in_make_test)


def test_the_shipped_budget_fits_thirty_minutes_with_the_install():
    budget = load_budget()
    planned = budget.install_s + sum(s.share_s for s in budget.suites if s.in_make_test)
    assert budget.total_s == 1800 and planned <= budget.total_s
    fast = next(s for s in budget.suites if s.name == "fast")
    assert not fast.in_make_test and fast.share_s <= 300


def test_every_test_file_belongs_to_a_suite_of_make_test():
    """A test directory left out of every suite would never run in CI."""
    budget = load_budget()
    main = next(s for s in budget.suites if s.name == "main")
    ignored = {a.removeprefix("--ignore=") for a in main.args if a.startswith("--ignore=")}
    others = {a for s in budget.suites if s.in_make_test and s is not main for a in s.args}
    assert ignored == {a for a in others if not a.startswith("-")}


def test_a_suite_within_its_share_passes_and_one_past_it_fails():
    suites = [_suite(name="a", share_s=100), _suite(name="b", share_s=50)]
    lines, ok = verdict([Outcome(suites[0], 0, 99.0), Outcome(suites[1], 5, 10.0)])
    assert ok
    assert "no tests collected" in lines[2]
    assert lines[-1].split()[:3] == ["all", "1:49", "2:30"]  # 109 s of 150 s
    lines, ok = verdict([Outcome(suites[0], 0, 130.0)])
    assert not ok and "OVER ITS SHARE by 30 s, past the noise allowance" in lines[1]


def test_the_noise_allowance_is_said_and_forgiven_only_up_to_its_fraction():
    suite = _suite(share_s=100)
    lines, ok = verdict([Outcome(suite, 0, 119.0)], noise=0.2)
    assert ok and "over its share by 19 s" in lines[1]
    lines, ok = verdict([Outcome(suite, 0, 121.0)], noise=0.2)
    assert not ok and "past the noise allowance" in lines[1]


def test_a_slow_host_is_named_but_fails_only_a_strict_run():
    suite = _suite(share_s=100)
    lines, ok = verdict([Outcome(suite, 0, 150.0)], noise=0.2, strict=False)
    assert ok and "OVER ITS SHARE by 50 s" in lines[1]
    lines, ok = verdict([Outcome(suite, 1, 150.0)], noise=0.2, strict=False)
    assert not ok and "FAILED (exit 1)" in lines[1]


def test_a_failed_suite_fails_within_its_share():
    lines, ok = verdict([Outcome(_suite(), 1, 10.0)])
    assert not ok and "FAILED (exit 1)" in lines[1]


def test_shares_past_the_total_are_refused_by_name():
    with pytest.raises(ValueError, match="add up to 1900 s, past the budget's total_s = 1800"):
        Budget(total_s=1800, install_s=300, durations=25, suites=[_suite(share_s=1600)])
    # A suite outside `make test` does not count against it.
    Budget(total_s=1800, install_s=300, durations=25, suites=[_suite(in_make_test=False)])
    with pytest.raises(ValueError, match="repeat"):
        Budget(total_s=1800, install_s=0, durations=25, suites=[_suite(), _suite()])


def test_the_makefile_runs_the_suites_and_the_readme_names_the_fast_loop():
    makefile = (REPO / "Makefile").read_text()
    assert "$(PY) -m tests.suites\n" in makefile and "$(PY) -m tests.suites fast" in makefile
    assert "make test-fast" in (REPO / "README.md").read_text()
