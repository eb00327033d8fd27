"""Stopping background asyncio tasks for sure.

Python 3.11's `asyncio.wait_for` can lose a cancellation that races the inner future's
completion (cpython gh-86296, fixed in 3.12): the cancelled task carries on. nats-py's
requests (`js.stream_info`, `consumer_info`, ...) run under `wait_for`, so a task cancelled
while one of them returns may go on polling, and a plain `cancel(); await gather(...)` then
waits for ever (a learner that hung at its end, seen in the shared-broker test). Here the
cancellation is repeated until each task has ended, within a bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)


async def cancel_and_wait(tasks: Iterable[asyncio.Task], *, timeout_s: float = 5.0) -> None:
    """Cancel `tasks` and wait until they have ended (their errors are not raised);
    repeat the cancellation for a task that swallowed it. Gives up after `timeout_s`."""
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending and loop.time() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.2)
    for task in pending:
        log.warning("task %s did not stop within %.0fs of its cancellation", task, timeout_s)


def swallowed_cancel() -> bool:
    """Whether the current task was cancelled and carries on regardless (see above): a
    loop that asks this after each request stops as it was told to."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
