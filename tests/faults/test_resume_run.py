"""A whole run stopped at once (a preempted machine, a reboot, Ctrl-C), then
`python -m deploy.local --resume latest`: the launcher and every process it started are
SIGKILLed after step 4 of 10, and the resumed run comes back on the same directory (its
checkpoints, the broker's file store, the same run id), finishes with exit 0, and its books
balance across both halves (deploy/run_ledger.py: every released prompt trained or dropped
once, every stored trajectory counted once, versions 1..10 in order). Real parts throughout,
as in test_faults.py: nats-server, the calculator env server, the learner, an actor replica
with a real vLLM engine on the tiny random-weight model."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy import proctree
from deploy.chaos import leftovers
from deploy.run_ledger import RunLedger
from learner.sinks import DONE_FILE
from tests.faults.test_faults import ARGS

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS, KILL_AFTER_STEP = 10, 4
STEPS = [f"learner.total_steps={TOTAL_STEPS}", f"learner.eval_interval={TOTAL_STEPS // 2}"]
LEARNING = [
    # The warm start, so that the evals measure a policy that learns: over these 10 steps
    # pass@1 went 0.31-0.50 -> 0.66-0.75 -> 0.69-0.91 in three uninterrupted runs (32
    # samples each), and a run that resumed wrongly shows.
    "local.warm_start=true",
    "actor.rollout.max_generate_length=64",  # a tool call fits (the fault suite's 16 not)
    "local.num_eval_rows=32",
    "learner.eval_samples_per_prompt=2",
]
EVAL_SAMPLES = 64
Z = 3.29
"""The band: 99.9% of the difference of two pass@1 estimates of EVAL_SAMPLES samples each
(three comparisons per run: a false alarm in about one run of 300)."""


def _launcher(runs_dir: Path, *args: str, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "deploy.local", *args, f"local.runs_dir={runs_dir}"]
    with open(log, "ab") as out:
        return subprocess.Popen(
            command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _trained_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if '"kind": "train"' in line]


def _kill_everything_after(launcher: subprocess.Popen, run_dir: Path, step: int) -> None:
    """SIGKILL the launcher and all it started once `step` is trained: no process stops
    cleanly, none writes anything more."""
    deadline = time.monotonic() + 600
    while not any(s >= step for s in _trained_steps(run_dir)):
        assert launcher.poll() is None, f"the launcher exited with {launcher.returncode}"
        assert time.monotonic() < deadline, f"step {step} never came"
        time.sleep(0.1)
    everyone = [launcher.pid, *(p.pid for p in proctree.descendants(launcher.pid))]
    for pid in everyone:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait(timeout=30)


def _pass_at_1(run_dir: Path) -> dict[int, float]:
    return {r["version"]: r["pass_at_1"] for r in RunLedger.read(run_dir).evals}


def test_a_run_killed_whole_resumes_where_it_stopped_with_its_books_whole(tmp_path):
    runs_dir, log = tmp_path / "runs", tmp_path / "launcher.log"
    # The uninterrupted run, for the eval band.
    baseline = _launcher(tmp_path / "baseline", *ARGS, *LEARNING, *STEPS, log=log)
    assert baseline.wait(timeout=900) == 0, log.read_text()[-4000:]
    uninterrupted = _pass_at_1((tmp_path / "baseline" / "latest").resolve())

    first = _launcher(runs_dir, *ARGS, *LEARNING, *STEPS, log=log)
    first_started = time.monotonic()
    latest = runs_dir / "latest"
    deadline = time.monotonic() + 120
    while not latest.exists():
        assert time.monotonic() < deadline and first.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    run_dir = latest.resolve()
    _kill_everything_after(first, run_dir, KILL_AFTER_STEP)
    first_reached_s = time.monotonic() - first_started  # what a new run would take again
    assert not (run_dir / DONE_FILE).exists()
    reached = max(_trained_steps(run_dir))

    resumed = _launcher(runs_dir, "--resume", "latest", log=log)
    started = time.monotonic()
    while max(_trained_steps(run_dir), default=-1) <= reached and resumed.poll() is None:
        time.sleep(0.1)  # cut back to the checkpoint, trained again, then one step further
    new_step_s = time.monotonic() - started
    assert resumed.wait(timeout=900) == 0, log.read_text()[-4000:]
    assert latest.resolve() == run_dir  # the same run, not a new one
    ledger = RunLedger.read(run_dir)
    assert ledger.problems() == []
    assert ledger.done["version"] == TOTAL_STEPS
    assert sorted(r["version"] for r in ledger.evals) == [0, TOTAL_STEPS // 2, TOTAL_STEPS]
    # Steps before the last checkpoint were kept, not redone: trained once, under one run id.
    assert [line["step"] for line in ledger.trained] == list(range(TOTAL_STEPS))
    run_ids = {g.rsplit("-", 1)[0] for line in ledger.trained for g in line["group_ids"]}
    assert run_ids == {ledger.done["run_id"]}
    learner_log = (run_dir / "logs" / "learner.log").read_text()
    assert "resuming run" in learner_log
    resumed_from = re.findall(r"resumed from .* at version (\d+)", learner_log)[-1]
    report = {
        "step_reached": reached,
        "resumed_from_version": int(resumed_from),
        "steps_trained_again": reached + 1 - int(resumed_from),
        "seconds_to_a_new_step": round(new_step_s, 1),  # start-up, the steps again, one more
        "a_new_run_to_the_same_step_s": round(first_reached_s, 1),  # the stop without a resume
        **{k: ledger.done[k] for k in ("resumed_episodes", "resumed_turns", "resumed_tokens")},
    }
    resumed_pass_at_1 = _pass_at_1(run_dir)
    report["eval_pass_at_1"] = {"uninterrupted": uninterrupted, "resumed": resumed_pass_at_1}
    print("RESUME-RUN-REPORT", json.dumps(report), flush=True)
    # The same eval band as the run that was never stopped, version by version.
    assert resumed_pass_at_1.keys() == uninterrupted.keys()
    for version, p in resumed_pass_at_1.items():
        q = uninterrupted[version]
        band = Z * math.sqrt(max(p * (1 - p) + q * (1 - q), 0.1) / EVAL_SAMPLES)
        assert abs(p - q) <= band, (version, p, q, band)
    deadline = time.monotonic() + 15
    while (left := leftovers(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []

    # A finished run is not started again.
    again = subprocess.run(
        [sys.executable, "-m", "deploy.local", "--resume", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert "finished already" in again.stdout
