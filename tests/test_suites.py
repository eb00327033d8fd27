"""The test budget (tests/suites.toml) and its verdict: a suite past its share fails
`make test` even when its tests pass, and the shares cannot quietly outgrow the total."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.suites import Budget, Outcome, Suite, load_budget, run_suites, verdict

REPO = Path(__file__).resolve().parents[1]


def _suite(*, name: str = "main", share_s: float = 600.0, in_make_test: bool = True) -> Suite:
    return Suite(name=name, args=["tests"], share_s=share_s, buys="x", in_make_test=in_make_test)


def test_the_shipped_budget_fits_thirty_minutes_with_the_install():
    budget = load_budget()
    assert budget.total_s == 1800 and budget.planned_s <= budget.total_s
    fast = next(s for s in budget.suites if s.name == "fast")
    assert not fast.in_make_test and fast.share_s <= 300


def test_every_test_file_belongs_to_a_suite_of_make_test():
    """A test directory left out of every suite would never run in CI."""
    budget = load_budget()
    main = next(s for s in budget.suites if s.name == "main")
    ignored = {a.split("=", 1)[1] for a in main.args if a.startswith(("--ignore=", "--deselect="))}
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


def test_a_suite_alongside_another_needs_a_host_with_room_and_adds_no_time():
    host, after = _suite(name="main", share_s=600), _suite(name="e2e", share_s=100)
    beside = Suite(**{**_suite(name="rebuild", share_s=600).__dict__, "alongside": "main"})
    budget = Budget(total_s=900, install_s=200, durations=5, suites=[host, beside, after])
    assert budget.planned_s == 900  # the install, main and e2e: rebuild runs within main
    lines, ok = verdict([Outcome(host, 0, 590.0), Outcome(beside, 0, 480.0)])
    assert ok and lines[-1].split()[:3] == ["all", "9:50", "10:00"]
    for bad in ({"alongside": "nowhere"}, {"share_s": 601.0}):
        wrong = Suite(**{**beside.__dict__, **bad})
        with pytest.raises(ValueError, match="runs alongside"):
            Budget(total_s=900, install_s=200, durations=5, suites=[host, wrong, after])


def test_a_suite_alongside_runs_niced_beside_its_host_and_the_next_waits_for_both(capfd):
    def suite(name: str, **fields) -> Suite:
        one = "tests/test_suites.py::test_a_failed_suite_fails_within_its_share"
        return Suite(
            name=name, args=[one, "-p", "no:cacheprovider"], share_s=60, buys="x", **fields
        )

    chosen = [suite("host"), suite("beside", alongside="host"), suite("after")]
    outcomes, wall_s = run_suites(chosen, 1, [])
    assert [(o.suite.name, o.exit_code) for o in outcomes] == [
        ("host", 0), ("beside", 0), ("after", 0)
    ]  # fmt: skip
    assert wall_s >= outcomes[0].wall_s + outcomes[2].wall_s
    out = capfd.readouterr().out
    assert out.index("suite beside (alongside, nice 19)") < out.index("suite host: exit 0")
    assert out.index("suite beside: exit 0") < out.index("suite after: pytest")
