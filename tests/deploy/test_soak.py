"""deploy/soak.py and deploy/chaos.py, the parts that need no run: the fault schedule, the
stall arithmetic, which process a fault strikes."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

from deploy.chaos import Fault, Outcome, _due, target_pids
from deploy.soak import KINDS, schedule, stalls


def test_schedule_strikes_every_kind_once_per_round_within_the_minutes():
    faults = schedule(minutes=20, every_s=60, rng=random.Random(0))
    times = [f.at_s for f in faults]
    assert times == sorted(times) and times[-1] <= 20 * 60
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert all(30 <= g <= 90 for g in gaps)  # 0.5-1.5 x every_s
    rounds = [faults[i : i + len(KINDS)] for i in range(0, len(faults), len(KINDS))]
    for whole in rounds[:-1]:
        assert sorted((f.target, f.signum) for f in whole) == sorted(KINDS)
    assert schedule(20, 60, random.Random(0)) == faults  # a seed is a schedule


def test_stall_is_the_wait_for_the_next_step_less_the_median_step():
    # Steps every 2 s; a fault at 5.0 is followed by a step at 13.0: 8 s to the next step,
    # of which 6 s are stall (the median step, 2 s, would have passed anyway).
    outcome = Outcome(
        code=0,
        run_dir=Path("."),
        output="",
        first_step_at=0.0,
        finished_at=20.0,
        struck=[(Fault("learner", at_s=5.0), [123], 5.0)],
        struck_wall=[1e9],
        step_times={0: 0.0, 1: 2.0, 2: 4.0, 3: 13.0, 4: 15.0, 5: 17.0},
    )
    rows, median = stalls(outcome)
    assert median == 2.0
    assert rows == [
        {
            "at_s": 5.0,
            "target": "learner",
            "signal": "SIGKILL",
            "pids": [123],
            "restarted_after_s": None,  # no supervisor records in this directory
            "next_step_s": 8.0,
            "stall_s": 6.0,
        }
    ]


def test_a_fault_is_due_at_its_step_or_its_time():
    assert _due(Fault("envserver", after_step=2), {0: 0.0, 1: 1.0, 2: 2.0})
    assert not _due(Fault("envserver", after_step=3), {0: 0.0})
    assert not _due(Fault("envserver", at_s=1e9), {0: 0.0})
    assert _due(Fault("envserver", at_s=0.0, signum=signal.SIGSTOP), {0: 0.0})


def test_a_role_fault_strikes_the_pid_the_supervisor_wrote(tmp_path):
    (tmp_path / "processes.json").write_text(json.dumps({"learner": 4242, "envserver": None}))
    assert target_pids(tmp_path, "learner") == [4242]
    assert target_pids(tmp_path, "envserver") == []  # between a crash and its restart
