"""How long to wait for a peer that may start later (the broker, an env server), and when
to say so: the one rule every "waiting for X" loop follows.

    failure at t ─► give up?   t - started >= timeout_s (None: never)
                ─► say so?     the first failure, then once every log_every_s
                ─► try again after first_s, doubling to max_s

A peer that is down gets a line at once naming it and what to start, then a line every
~30 s instead of one per attempt, and a bounded total wait where one is given. Pure: the
caller feeds it the clock and does the waiting (broker/connection.py, actors/env_health.py).
"""

from __future__ import annotations

from dataclasses import dataclass

LOG_EVERY_S = 30.0
"""Seconds between two "still waiting" lines."""


@dataclass(frozen=True)
class NextTry:
    """What to do after a failed attempt."""

    delay_s: float
    """Wait this long before the next attempt."""
    say: bool
    """Log a line now (the first failure, then every log_every_s)."""
    give_up: bool
    """The total wait is spent: stop trying and fail."""
    waited_s: float
    """Seconds since the wait started."""


@dataclass
class Waiting:
    """The state of one wait; `failed(now)` after every failed attempt."""

    started_at: float
    timeout_s: float | None = None
    """Total wait before giving up; None waits for ever."""
    first_s: float = 0.25
    max_s: float = 5.0
    log_every_s: float = LOG_EVERY_S
    num_failures: int = 0
    said_at: float | None = None

    def failed(self, now: float) -> NextTry:
        waited_s = now - self.started_at
        delay_s = min(self.first_s * 2**self.num_failures, self.max_s)
        self.num_failures += 1
        if self.timeout_s is not None:
            if waited_s >= self.timeout_s:
                return NextTry(0.0, say=True, give_up=True, waited_s=waited_s)
            delay_s = min(delay_s, self.timeout_s - waited_s)  # the last try at the deadline
        say = self.said_at is None or now - self.said_at >= self.log_every_s
        if say:
            self.said_at = now
        return NextTry(delay_s, say=say, give_up=False, waited_s=waited_s)
