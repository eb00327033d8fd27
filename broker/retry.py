"""Retry a bus call until the broker takes it: for calls whose loss would lose state (a
policy announcement, the learner's setup and final accounting) in processes that must ride
out a broker restart rather than die of it.

    until_done(lambda: kv.put(key, value), "policy version")
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from broker.trajectories import RETRYABLE_PUBLISH_ERRORS, PublishRetry

T = TypeVar("T")

RETRYABLE_ERRORS = (*RETRYABLE_PUBLISH_ERRORS, ConnectionResetError)
"""Not taken yet, try again: the broker is restarting (no responders, timeouts, JetStream
not ready), or the connection broke under a write (asyncio's "Connection lost")."""


async def until_done(call: Callable[[], Awaitable[T]], what: str) -> T:
    """`await call()` until it returns, backing off (0.05 s doubling to 2 s) while the
    broker is away; every other error propagates."""
    retry = PublishRetry(what)
    while True:
        try:
            return await call()
        # Network boundary: retryable by the list above; the client reconnects meanwhile.
        except RETRYABLE_ERRORS as e:
            await retry.wait(e)
