"""What `make cluster-up TARGET=ray` shows while a run goes on: what `make run` shows (the
progress line of each training step and the line of each restart, deploy/progress.py's
`RunFollower` over the run directory, a shared filesystem), and at the end the summary
table, `summary.json` and `progress.png`. It asks the run's supervisor for its state;
Ctrl-C stops following, not the run.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from ray.exceptions import RayError

from deploy import progress


def _say(text: str = "") -> None:
    print(text, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def follow(ray, supervisor, run_dir: Path, total_steps: int) -> int:
    """Progress lines until the run ends; Ctrl-C leaves the run going."""
    interrupted = []
    signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    signal.signal(signal.SIGTERM, lambda *_: interrupted.append(True))
    follower = progress.RunFollower(run_dir, total_steps)
    status = {"state": "running"}
    next_status = 0.0
    while True:
        for line in follower.poll():
            _say(line)
        if time.monotonic() >= next_status:
            try:
                status = ray.get(supervisor.status.remote(), timeout=30)
            except RayError as e:  # the supervisor died: nothing says how the run ends
                _err(f"\nthe run's supervisor is gone ({type(e).__name__}); see {run_dir}/logs")
                return 1
            next_status = time.monotonic() + 2.0
        if status["state"] == "finished":
            for line in follower.poll():  # the learner's last records
                _say(line)
            progress.finish(run_dir, follower.records, say=_say)
            _say("every process of the run has stopped; `make cluster-down TARGET=ray` clears it")
            return 0
        if status["state"] == "failed":
            for line in follower.poll():  # the give-up's own line
                _say(line)
            _err(f"\nthe run failed: {status['detail']}; logs in {run_dir / 'logs'}")
            return 1
        if interrupted:
            _err("\nstopped following; the run goes on (`make cluster-down TARGET=ray` stops it)")
            return 130
        time.sleep(0.5)
