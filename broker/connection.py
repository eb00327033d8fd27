"""Connect to NATS the way every long-lived Tether process should: reconnect forever,
report every error, never die because the broker restarted.

Credentials never sit in a config file: a server that requires a user and password gets
them from the environment variables `NATS_USER` and `NATS_PASSWORD` (the names the `nats`
CLI uses), which a cluster fills from a Secret.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import nats.errors
from nats.aio.client import Client

from broker.server import MAX_PAYLOAD_BYTES

log = logging.getLogger(__name__)


def credentials(environ=os.environ) -> dict[str, str]:
    """`user` and `password` for nats-py's connect, from NATS_USER / NATS_PASSWORD if set."""
    user, password = environ.get("NATS_USER", ""), environ.get("NATS_PASSWORD", "")
    if bool(user) != bool(password):
        raise ValueError("set both NATS_USER and NATS_PASSWORD, or neither")
    return {"user": user, "password": password} if user else {}


# The client's read buffer must hold several max-size messages in flight.
PENDING_SIZE_BYTES = 16 * MAX_PAYLOAD_BYTES


async def connect(
    url: str, *, name: str, connect_timeout_s: float = 60.0, reconnect_wait_s: float = 0.5
) -> Client:
    """Connect with reconnect-forever semantics.

    The first connection is retried until `connect_timeout_s` (a process may start before
    the broker); after that the client reconnects forever and logs each disconnect.
    """

    async def on_error(e: Exception) -> None:
        log.warning("nats %s: %s: %s", name, type(e).__name__, e)

    nc = Client()

    async def on_disconnected() -> None:
        if not nc.is_closed:  # an intentional close() is not worth a warning
            log.warning("nats %s: disconnected from %s, reconnecting", name, url)

    async def on_reconnected() -> None:
        log.info("nats %s: reconnected to %s", name, url)

    deadline = time.monotonic() + connect_timeout_s
    while True:
        try:
            await nc.connect(
                servers=[url],
                name=name,
                max_reconnect_attempts=-1,
                reconnect_time_wait=reconnect_wait_s,
                connect_timeout=2,
                pending_size=PENDING_SIZE_BYTES,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                **credentials(),
            )
            return nc
        # Network boundary: the broker may not be up yet; retry until the deadline.
        except (TimeoutError, nats.errors.NoServersError, OSError) as e:
            if time.monotonic() > deadline:
                raise ConnectionError(f"cannot reach NATS at {url}: {e}") from e
            await asyncio.sleep(reconnect_wait_s)
