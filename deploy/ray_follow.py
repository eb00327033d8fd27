"""What `make cluster-up TARGET=ray` shows while a run goes on: one progress line per training
step from the learner's metrics.jsonl (common/progress.py, as `make run` shows them), the
restarts from the run's events.jsonl as they happen, and at the end the summary table,
`summary.json` and `progress.png`. It reads files in the run directory (a shared filesystem)
and asks the run's supervisor for its state; Ctrl-C stops following, not the run.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from ray.exceptions import RayError

from common.progress import ProgressView
from deploy import progress
from deploy.ray_records import EVENTS_FILE


def _say(text: str = "") -> None:
    print(text, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _event_line(event: dict) -> str | None:
    role, kind = event.get("role"), event.get("event")
    if kind == "started" and event.get("restarted"):
        return f"  {role} restarted by Ray on {event.get('node')} (pid {event.get('pid')})"
    if kind == "exited" and not event.get("stopping") and event.get("code") != 0:
        return f"  {role} exited with code {event.get('code')}"
    if role == "supervisor" and kind in ("learner restart", "failed"):
        return f"  supervisor: {kind} {event.get('attempt') or event.get('detail') or ''}".rstrip()
    return None


def follow(ray, supervisor, run_dir: Path, total_steps: int) -> int:
    """Progress lines until the run ends; Ctrl-C leaves the run going."""
    interrupted = []
    signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    signal.signal(signal.SIGTERM, lambda *_: interrupted.append(True))
    metrics_path = run_dir / "metrics.jsonl"
    events_path = run_dir / EVENTS_FILE
    offset, events_offset = 0, 0
    records: list[dict] = []
    view = ProgressView(total_steps)
    status = {"state": "running"}
    next_status = 0.0
    metrics_file = None
    while True:
        # A restarted learner cuts metrics.jsonl back to its checkpoint (a new file, put in
        # place atomically) and writes the steps since again: read it again from the top.
        now_file = _file_identity(metrics_path)
        if now_file[0] != (metrics_file or now_file)[0] or now_file[1] < offset:
            offset, records = 0, []
            view.learner_restarted()
        metrics_file = now_file
        new, offset = progress.read_records(metrics_path, offset)
        for record in new:
            records.append(record)
            for line in view.lines(record):
                _say(line)
        events, events_offset = progress.read_records(events_path, events_offset)
        for event in events:
            line = _event_line(event)
            if line:
                _say(line)
        if time.monotonic() >= next_status:
            try:
                status = ray.get(supervisor.status.remote(), timeout=30)
            except RayError as e:  # the supervisor died: nothing says how the run ends
                _err(f"\nthe run's supervisor is gone ({type(e).__name__}); see {run_dir}/logs")
                return 1
            next_status = time.monotonic() + 2.0
        if status["state"] == "finished":
            new, offset = progress.read_records(metrics_path, offset)
            records.extend(new)
            progress.finish(run_dir, records, say=_say)
            _say("every process of the run has stopped; `make cluster-down TARGET=ray` clears it")
            return 0
        if status["state"] == "failed":
            _err(f"\nthe run failed: {status['detail']}; logs in {run_dir / 'logs'}")
            return 1
        if interrupted:
            _err("\nstopped following; the run goes on (`make cluster-down TARGET=ray` stops it)")
            return 130
        time.sleep(0.5)


def _file_identity(path: Path) -> tuple[int | None, int]:
    """(inode, size) of `path`; (None, 0) while it does not exist."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None, 0
    return stat.st_ino, stat.st_size
