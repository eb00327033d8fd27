"""Where a learner step and an actor step go, now and before: py-spy over a real `make run`.

    python -m bench.profile_steps [--before REV] [--from-step 3] [--window-s 40] [--rate 50]

For this checkout and for the revision `--before` (default 66aa702: the code before
shared-prefix training, two engines and dense attention masks; checked out in a git worktree and run
with this checkout's interpreter and packages), the script runs `python -m deploy.local`
as `make run` does (that revision's configs/demo.toml, `--steps` 16), waits for the learner's
step `--from-step` (start-up over), and samples every process of the run with py-spy
(`--subprocesses --nonblocking`, `--rate` Hz, running threads only) for `--window-s`.
bench/profile_support.py sorts the samples by process role (learner, actor replica, vLLM
engine) and category of work; dividing by the training steps that finished inside the
window gives seconds per step of each role's running Python threads, by category. Time a
role does not spend running is time it waits. The evals that fall inside the window (one
every 5 steps in the demo) are part of the average step, as they are part of `make run`.

Writes bench/results/profile_steps.json and prints the tables; `--raw-dir` keeps the raw
samples (`flamegraph.pl` or speedscope read them).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import Benchmark, load_average, print_table, write_results
from bench.profile_support import mean_step_s, parse_raw, per_step, profile
from bench.tether_run import REPO, RunRecord, watch_run

BENCHMARK = Benchmark(
    measures="where a learner step and an actor step go, now and before (py-spy)",
    target="bench",
    minutes=6,
)

ROLES_SHOWN = ("learner", "actor", "engine")


def py_spy() -> str:
    """The py-spy executable beside this interpreter (the `dev` extra), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("profile_steps: py-spy is missing: make install (the dev extra) has it")
    return found


class WindowSampler:
    """An `on_poll` hook: once step `from_step` is recorded, py-spy samples the launcher and
    all its descendants for `window_s`; remembers the window on the launch clock."""

    def __init__(self, out: Path, *, from_step: int, window_s: int, rate: int) -> None:
        self.out, self.from_step, self.window_s, self.rate = out, from_step, window_s, rate
        self.window: tuple[float, float] | None = None
        self.sampler: subprocess.Popen | None = None

    def __call__(self, run: RunRecord, launcher: subprocess.Popen, t: float) -> None:
        if self.sampler is not None or not any(r["step"] >= self.from_step for r in run.train):
            return
        command = [py_spy(), "record", "--pid", str(launcher.pid), "--subprocesses"]
        command += ["--nonblocking", "--rate", str(self.rate), "--duration", str(self.window_s)]
        command += ["--format", "raw", "--output", str(self.out)]
        self.sampler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.window = (t, t + self.window_s)

    def finish(self, run: RunRecord) -> dict:
        if self.sampler is None or self.window is None:
            raise RuntimeError(f"the run ended before step {self.from_step}: nothing sampled")
        _, errors = self.sampler.communicate(timeout=self.window_s + 60)
        if not self.out.is_file():
            raise RuntimeError(f"py-spy wrote no samples: {errors.decode()[-2000:]}")
        step_s = mean_step_s([r for r in run.train if self.window[0] < r["t"] <= self.window[1]])
        steps = self.window_s / step_s
        seconds = per_step(profile(parse_raw(self.out.open())), rate_hz=self.rate, steps=steps)
        return {"steps_in_window": steps, "s_per_step": step_s, "roles": seconds}


def profile_revision(repo: Path, work: Path, args: argparse.Namespace) -> dict:
    sampler = WindowSampler(
        work / "pyspy.raw", from_step=args.from_step, window_s=args.window_s, rate=args.rate
    )
    run = watch_run([f"learner.total_steps={args.steps}"], work, repo=repo, on_poll=sampler)
    return sampler.finish(run)


def worktree(rev: str, parent: Path) -> Path:
    path = parent / f"rev-{rev}"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), rev],
        check=True,
        capture_output=True,
    )
    return path


def flatten(label: str, result: dict) -> dict:
    figures = {
        f"{label}_steps_in_window": result["steps_in_window"],
        f"{label}_s_per_step": result["s_per_step"],
    }
    for role, categories in result["roles"].items():
        for category, seconds in categories.items():
            figures[f"{label}|{role}|{category}"] = seconds
    return figures


def print_profile(label: str, result: dict) -> None:
    title = (
        f"{label}: {result['s_per_step']:.2f} s per step ({result['steps_in_window']:.1f} steps)"
    )
    rows = [
        (f"{role} | {category}", seconds)
        for role in ROLES_SHOWN
        for category, seconds in sorted(
            result["roles"].get(role, {}).items(), key=lambda item: -item[1]
        )
    ]
    print_table(f"{title}; running s per step by role | category", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="66aa702", help="revision to compare ('' = none)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--from-step", type=int, default=3)
    parser.add_argument("--window-s", type=int, default=30)
    parser.add_argument("--rate", type=int, default=50)
    parser.add_argument("--raw-dir", type=Path, help="keep py-spy's raw samples here")
    args = parser.parse_args()
    figures: dict = {"before_rev": args.before, "rate_hz": args.rate, "window_s": args.window_s}
    figures["from_step"] = args.from_step
    figures["after_rev"] = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="tether-profile-") as tmp:
        revisions = [("after", REPO)]
        if args.before:
            revisions.insert(0, ("before", worktree(args.before, Path(tmp))))
        try:
            with load_average() as load:
                for label, repo in revisions:
                    work = Path(tmp) / label
                    work.mkdir()
                    result = profile_revision(repo, work, args)
                    if args.raw_dir:
                        args.raw_dir.mkdir(parents=True, exist_ok=True)
                        shutil.copy(work / "pyspy.raw", args.raw_dir / f"{label}.raw")
                    print_profile(f"{label} ({repo})", result)
                    figures |= flatten(label, result)
        finally:
            if args.before:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(revisions[0][1])],
                    capture_output=True,
                )
    write_results("profile_steps", figures | load)


if __name__ == "__main__":
    main()
