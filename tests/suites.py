"""Runs `make test`'s suites, each in a pytest process of its own, and holds them to their
shares of the time budget in `tests/suites.toml`.

    python -m tests.suites              every suite of `make test`, then the budget table
    python -m tests.suites fast         one suite by name (`make test-fast`)
    python -m tests.suites --list       the suites, their shares and what each one buys

Every suite runs even when an earlier one fails; the exit code is 1 when any suite failed.
A suite past its share by more than the noise allowance is named in capitals in the table,
and fails the run only under `--strict` (a reviewer's check on a quiet machine): these
machines are shared, and a slow host must not turn passing tests red. pytest's exit code 5
(nothing collected) is not a failure. Each suite prints its slowest tests (`--durations`), so where
the time goes is in every log.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

SUITES_FILE = Path(__file__).with_name("suites.toml")
REPO = SUITES_FILE.parents[1]
NO_TESTS_COLLECTED = 5


@dataclass(frozen=True)
class Suite:
    name: str
    args: list[str]
    share_s: float
    """Wall seconds this suite may take on a 2-core machine before the budget check fails."""
    buys: str
    """What the suite proves that nothing cheaper does."""
    in_make_test: bool = True


@dataclass(frozen=True)
class Budget:
    total_s: float
    """What `make test` may take from a fresh clone, install included."""
    install_s: float
    """The install's share of `total_s` (a fresh clone's `make install-test`)."""
    durations: int
    """How many of its slowest tests each suite prints."""
    suites: list[Suite]
    noise: float = 0.0
    """How far past its share a suite may run before it fails, as a fraction of the share:
    the run-to-run spread of one suite on these shared machines (the main suite took 12:16
    and 13:53 in two fresh-clone runs of the same tests)."""

    def __post_init__(self) -> None:
        names = [s.name for s in self.suites]
        if len(set(names)) != len(names):
            raise ValueError(f"{SUITES_FILE.name}: suite names repeat: {names}")
        planned = self.install_s + sum(s.share_s for s in self.suites if s.in_make_test)
        if planned > self.total_s:
            raise ValueError(
                f"{SUITES_FILE.name}: the install's share and the suites' shares add up to "
                f"{planned:.0f} s, past the budget's total_s = {self.total_s:.0f} s: "
                "lower a share, or raise total_s as a visible decision"
            )


def load_budget(path: Path = SUITES_FILE) -> Budget:
    raw = tomllib.loads(path.read_text())
    return Budget(
        total_s=raw["total_s"],
        install_s=raw["install_s"],
        durations=raw["durations"],
        suites=[Suite(**suite) for suite in raw["suite"]],
        noise=raw["noise"],
    )


@dataclass(frozen=True)
class Outcome:
    suite: Suite
    exit_code: int
    wall_s: float

    @property
    def failed(self) -> bool:
        return self.exit_code not in (0, NO_TESTS_COLLECTED)

    @property
    def past_share_s(self) -> float:
        return self.wall_s - self.suite.share_s


def verdict(
    outcomes: list[Outcome], noise: float = 0.0, strict: bool = True
) -> tuple[list[str], bool]:
    """The budget table's lines and whether every suite passed and, when `strict`, none ran
    past its share by more than `noise` of it."""
    lines = [f"{'suite':<14} {'wall':>8} {'share':>8}  result"]
    too_slow = False
    for o in outcomes:
        if o.failed:
            result = f"FAILED (exit {o.exit_code})"
        elif o.exit_code == NO_TESTS_COLLECTED:
            result = "no tests collected"
        else:
            result = "passed"
        if o.past_share_s > noise * o.suite.share_s:
            too_slow = True
            result += f"; OVER ITS SHARE by {o.past_share_s:.0f} s, past the noise allowance"
        elif o.past_share_s > 0:
            result += f"; over its share by {o.past_share_s:.0f} s"
        wall, share = _mmss(o.wall_s), _mmss(o.suite.share_s)
        lines.append(f"{o.suite.name:<14} {wall:>8} {share:>8}  {result}")
    total = sum(o.wall_s for o in outcomes)
    share = sum(o.suite.share_s for o in outcomes)
    lines.append(f"{'all':<14} {_mmss(total):>8} {_mmss(share):>8}")
    ok = not (strict and too_slow) and not any(o.failed for o in outcomes)
    return lines, ok


def _mmss(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def run_suite(suite: Suite, durations: int, extra: list[str]) -> Outcome:
    print(f"\n===== suite {suite.name}: pytest {' '.join(suite.args + extra)}", flush=True)
    started = time.monotonic()
    code = subprocess.call(
        [sys.executable, "-m", "pytest", *suite.args, f"--durations={durations}", *extra],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    outcome = Outcome(suite, code, time.monotonic() - started)
    print(f"===== suite {suite.name}: exit {code} in {_mmss(outcome.wall_s)}", flush=True)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.suites", description=__doc__)
    parser.add_argument("names", nargs="*", help="suites to run (default: those of make test)")
    parser.add_argument("--list", action="store_true", help="print the suites and exit")
    parser.add_argument(
        "--strict", action="store_true", help="fail a suite past its share and the noise allowance"
    )
    args, extra = parser.parse_known_args(argv)
    budget = load_budget()
    by_name = {s.name: s for s in budget.suites}
    if args.list:
        for s in budget.suites:
            where = "make test" if s.in_make_test else "own target"
            print(f"{s.name:<14} {_mmss(s.share_s):>6}  ({where})  {s.buys}")
        return 0
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        parser.error(f"no suite {unknown}; the suites: {sorted(by_name)}")
    chosen = [by_name[n] for n in args.names] or [s for s in budget.suites if s.in_make_test]
    # The suites' processes must not inherit a caller's stdin (CI has none) nor its pytest
    # options: each suite is exactly what suites.toml says, plus what was given here.
    os.environ.pop("PYTEST_ADDOPTS", None)
    outcomes = [run_suite(s, budget.durations, extra) for s in chosen]
    lines, ok = verdict(outcomes, budget.noise, args.strict)
    print("\n" + "\n".join(lines), flush=True)
    if any("OVER ITS SHARE" in line for line in lines):
        print(
            "\nmake test: a suite ran past its share (tests/suites.toml); its slowest tests "
            "are listed above it",
            file=sys.stderr,
        )
    if any(o.failed for o in outcomes):
        print("\nmake test: a suite failed", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
