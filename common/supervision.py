"""Supervision, once for every launcher: when a process that died is restarted (backoff and
a restart budget, the way Kubernetes' CrashLoopBackOff and Ray's `max_restarts` decide it),
and the one event format every supervisor writes to its run's `events.jsonl`.

    exit ─► final code (EXIT_CONFIG, EXIT_UNREACHABLE, EXIT_GAVE_UP)? give up
        ─► code 0 of a role that `finishes` (the learner)? finished
        ─► ran >= healthy_after_s? reset the crash streak
        ─► restarts in the last window_s >= budget? give up
        ─► restart at exit + min(initial_backoff_s * 2**streak, max_backoff_s)

`Supervised` is that decision for one role (pure: no clock, no processes); the supervisors
feed it times and act on its answer: deploy/supervisor.py for `make run`'s role processes,
actors/replicas.py for `actor --replicas N`'s replicas, deploy/ray_supervisor.py for a run
on Ray. All three write the same events (`Events`), and `[restarts]`
(`RestartPolicy`) is the one section that sets them.

Budgets do not stack: a supervisor that gave up on a process it supervises exits
EXIT_GAVE_UP, which the supervisor above it takes as final.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pydantic

from common.config import StrictModel

EXIT_CONFIG = 2
"""Exit code of a process that cannot start as configured: a bad config, model path or
dataset, a port already taken, credentials the broker refuses. Every CLI's usage errors
too. Restarting it would fail the same way."""
EXIT_UNREACHABLE = 69  # sysexits.h EX_UNAVAILABLE
"""Exit code of a process that waited its bounded time for a peer (the broker,
`broker.connect_timeout_s`) and gave up: the wait with backoff already happened inside it."""
EXIT_GAVE_UP = 3
"""Exit code of a supervisor that spent a process's restart budget (`actor --replicas N`
when a replica crash-loops): restarting the supervisor would give that process a second
budget on top of the first."""
FINAL_EXIT_CODES = {
    EXIT_CONFIG: "cannot start as configured",
    EXIT_UNREACHABLE: "gave up waiting for a peer",
    EXIT_GAVE_UP: "a process it supervises spent its restart budget",
}


class RestartPolicy(StrictModel):
    """How a supervisor restarts a process that exits without being asked to."""

    initial_backoff_s: float = pydantic.Field(default=1.0, ge=0)
    """Wait before the first restart of a crash streak; doubles with each further crash."""
    max_backoff_s: float = pydantic.Field(default=30.0, ge=0)
    """Longest wait between a crash and its restart."""
    budget: int = pydantic.Field(default=10, ge=0)
    """Restarts allowed within `window_s`; the next crash is final (the supervisor gives up
    and the run fails). 0: never restart."""
    window_s: float = pydantic.Field(default=600.0, gt=0)
    """The sliding window over which `budget` counts restarts."""
    healthy_after_s: float = pydantic.Field(default=60.0, ge=0)
    """A process that ran this long before it died starts a new crash streak (the first
    backoff again): it was healthy, not crash-looping."""
    startup_timeout_s: float = pydantic.Field(default=900.0, gt=0)
    """A process with a liveness probe that has not answered it once this long after it
    started is hung in its start-up (stopped, deadlocked): from then on its missed probes
    count, and it is killed and restarted as a hung one. Long enough for a big model's load."""


@dataclass
class RestartTracker:
    """One supervised process's restart history under a policy."""

    policy: RestartPolicy
    restarts: list[float] = field(default_factory=list)
    """When each restart within the window was decided (the exit times)."""
    crash_streak: int = 0
    """Crashes since the process last ran for `healthy_after_s`."""

    def on_exit(self, *, started_at: float, exited_at: float) -> float | None:
        """The process started at `started_at` died at `exited_at`: the time to start it
        again, or None when the restart budget is spent."""
        if exited_at - started_at >= self.policy.healthy_after_s:
            self.crash_streak = 0
        self.restarts = [t for t in self.restarts if exited_at - t < self.policy.window_s]
        if len(self.restarts) >= self.policy.budget:
            return None
        delay = min(self.policy.initial_backoff_s * 2**self.crash_streak, self.policy.max_backoff_s)
        self.crash_streak += 1
        self.restarts.append(exited_at)
        return exited_at + delay

    @property
    def num_restarts(self) -> int:
        """Restarts decided within the current window."""
        return len(self.restarts)


@dataclass(frozen=True)
class Verdict:
    """What a supervisor does about a process that exited."""

    action: Literal["restart", "finished", "gave_up"]
    restart_at: float | None = None
    """When to start it again (the supervisor's clock), for "restart"."""
    reason: str = ""
    """Why it gave up, for "gave_up"."""


class Supervised:
    """One role's life under a restart policy: `started(now)` each time it starts,
    `exited(code, now)` when it dies (code None: lost with its host or its Ray actor)."""

    def __init__(self, policy: RestartPolicy, *, finishes: bool = False) -> None:
        self.tracker = RestartTracker(policy)
        self.finishes = finishes
        """Exit code 0 means its work is done (the learner). Other roles are restarted
        whatever their exit code, as a Deployment's pods are."""
        self.started_at = 0.0
        self.starts = 0

    @property
    def num_restarts(self) -> int:
        """Starts after the first."""
        return max(self.starts - 1, 0)

    def started(self, now: float) -> int:
        """Record a start; returns how many restarts it makes (0 for the first start)."""
        self.started_at = now
        self.starts += 1
        return self.num_restarts

    def exited(self, code: int | None, now: float) -> Verdict:
        if code == 0 and self.finishes:
            return Verdict("finished")
        if code in FINAL_EXIT_CODES:  # it said so: a restart would fail the same way
            return Verdict("gave_up", reason=FINAL_EXIT_CODES[code])
        restart_at = self.tracker.on_exit(started_at=self.started_at, exited_at=now)
        if restart_at is None:
            budget = self.tracker.policy
            return Verdict(
                "gave_up",
                reason=f"restart budget spent ({budget.budget} in {budget.window_s:.0f}s, "
                "restarts.budget)",
            )
        return Verdict("restart", restart_at=restart_at)


# ---- the event format -------------------------------------------------------------------------

EVENTS_FILE = "events.jsonl"
"""A run's supervision events, in its run directory: one JSON object a line, `time` (Unix
seconds), `role`, `event` and the event's fields:

    started       pid, restart (0 for the first start), node (on Ray)
    exited        pid, code (None: lost with its host), restart_in_s
    gave_up       pid, code, reason: the run cannot go on
    finished      pid, code 0: the learner's work is done
    unresponsive  pid, missed: its liveness probe failed that many times in a row; killed

A replica's role is its actor process's role with `/replica-<i>` (`actor/replica-1`)."""
EVENTS_ENV = "TETHER_EVENTS"
"""The run's events file, in the environment of every role process a launcher starts: a
supervisor inside a role (the actor's, of its replicas) writes there too."""
ROLE_ENV = "TETHER_ROLE"
"""The role's name in the events, in its process's environment."""


class Events:
    """Appends events to a run's events file (None: nowhere, for a process started by hand).
    One write per line: supervisors in several processes share the file."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None

    @classmethod
    def from_environment(cls, environ=os.environ) -> Events:
        return cls(environ.get(EVENTS_ENV))

    def write(self, role: str, event: str, **fields) -> dict:
        record = {"time": round(time.time(), 3), "role": role, "event": event, **fields}
        if self.path is not None:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(record) + "\n").encode())
            finally:
                os.close(fd)
        return record


def read_events(run_dir: str | Path) -> list[dict]:
    """A run's events (empty when nothing was ever started); a line being written is left
    out."""
    path = Path(run_dir) / EVENTS_FILE
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def event_line(event: dict) -> str | None:
    """The line a launcher shows for an event; None for a first start (the launcher says
    what it started) and for events that are not supervision's."""
    role, kind = event["role"], event["event"]
    where = f" on {event['node']}" if event.get("node") else ""
    if kind == "started":
        if not event.get("restart"):
            return None
        return (
            f"supervisor: {role} restarted{where} (pid {event['pid']}, restart {event['restart']})"
        )
    if kind == "exited":
        code = "lost" if event.get("code") is None else f"exited with code {event['code']}"
        return f"supervisor: {role} {code}; restarting in {event['restart_in_s']:.1f}s"
    if kind == "gave_up":
        return (
            f"supervisor: {role} exited with code {event.get('code')}: {event['reason']}; giving up"
        )
    if kind == "unresponsive":
        return f"supervisor: {role} missed {event['missed']} probes in a row: killed"
    return _fleet_line(event)


def _fleet_line(event: dict) -> str | None:
    """An elastic fleet's changes (deploy/ray_elastic.py), as the run's supervisor wrote them."""
    role, kind = event["role"], event["event"]
    if kind == "scaled":
        return (
            f"fleet: {event['was']} -> {event['replicas']} actor replicas "
            f"({event['work']:g} groups released and not finished)"
        )
    if kind == "leaving":
        return f"fleet: {role} leaving, its episodes handed back at their next turn"
    if kind == "left" and event.get("code") not in (None, 0):
        return f"fleet: {role} left with code {event['code']}"
    return None
