"""When to restart a process that died: exponential backoff and a restart budget, the way
Kubernetes (CrashLoopBackOff) and Ray (`max_restarts`) decide it.

    exit ─► ran >= healthy_after_s? reset the crash streak
        ─► restarts in the last window_s >= budget? give up (None)
        ─► restart at exit + min(initial_backoff_s * 2**streak, max_backoff_s)

Pure: no clock, no processes. The supervisors feed it times (deploy/supervisor.py for the
launcher's roles, actors/replicas.py for actor replicas) and act on the answer.

An exit code in FINAL_EXIT_CODES is not a crash to retry: the process said it cannot start
as configured, or it already spent its bounded wait for a peer. A supervisor stops there
and passes the code on (actors/replicas.py does).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pydantic

from common.config import StrictModel

EXIT_CONFIG = 2
"""Exit code of a process that cannot start as configured: a bad config, model path or
dataset, a port already taken, credentials the broker refuses. Every CLI's usage errors
too. Restarting it would fail the same way."""
EXIT_UNREACHABLE = 69  # sysexits.h EX_UNAVAILABLE
"""Exit code of a process that waited its bounded time for a peer (the broker,
`broker.connect_timeout_s`) and gave up: the wait with backoff already happened inside it."""
FINAL_EXIT_CODES = {
    EXIT_CONFIG: "cannot start as configured",
    EXIT_UNREACHABLE: "gave up waiting for a peer",
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
