"""A warning that keeps happening (a peer gone, its reconnect failing again), said once and
then counted: the first occurrence is a line at once, later ones at most one line per
`every_s`, saying how many it stands for. A learner that is gone for ten minutes costs an
actor a line every 30 s, not one per retry.

    happened() ─► first ever, or every_s since the last line?  ─► the count to say (>= 1)
                  else                                          ─► 0: say nothing, count it

One `Repeats` per kind of line, owned by whoever logs it; the caller chooses the words.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

EVERY_S = 30.0
"""Seconds between two lines about the same repeating thing."""


class Repeats:
    def __init__(self, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self._clock = clock
        self._said_at: float | None = None
        self._unsaid = 0
        self.since_s = 0.0
        """Seconds from the line before to the one `happened()` last asked for."""

    def happened(self) -> int:
        """Count one occurrence. Returns how many occurrences a line said now stands for
        (this one and those left unsaid since the last line), or 0: say nothing now."""
        now = self._clock()
        self._unsaid += 1
        if self._said_at is not None and now - self._said_at < self.every_s:
            return 0
        self.since_s = 0.0 if self._said_at is None else now - self._said_at
        count, self._unsaid, self._said_at = self._unsaid, 0, now
        return count

    def warning(self, log: logging.Logger, msg: str, *args: object) -> None:
        """`log.warning(msg, *args)` when `happened()` says so, with the count when the line
        stands for more than this occurrence."""
        count = self.happened()
        if count == 1:
            log.warning(msg, *args)
        elif count > 1:
            log.warning(msg + " (%d times in %.0f s)", *args, count, self.since_s)
