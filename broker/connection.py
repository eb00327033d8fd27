"""Connect to NATS the way every long-lived Tether process should: reconnect forever,
report every error, never die because the broker restarted.

Credentials never sit in a config file: they come from the environment or from files
(`NATS_USER`/`NATS_PASSWORD` or `NATS_TOKEN`, each with a `_FILE` variant; see
broker/security.py), which a cluster fills from a Secret. With `[broker.tls]` configured,
the server's certificate is verified, and the credentials are handed over only on a
connection the server switched to TLS: a server (or an impostor) that does not start TLS
gets nothing and the connection fails with `InsecureBroker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client

from broker.config import BrokerTlsConfig
from broker.limits import MAX_PAYLOAD_BYTES
from broker.security import BrokerRefused, InsecureBroker, NatsAuth, client_tls_context

log = logging.getLogger(__name__)


# The client's read buffer must hold several max-size messages in flight.
PENDING_SIZE_BYTES = 16 * MAX_PAYLOAD_BYTES


async def connect(
    url: str,
    *,
    name: str,
    tls: BrokerTlsConfig | None = None,
    connect_timeout_s: float = 60.0,
    reconnect_wait_s: float = 0.5,
) -> Client:
    """Connect with reconnect-forever semantics.

    The first connection is retried until `connect_timeout_s` (a process may start before
    the broker); after that the client reconnects forever and logs each disconnect.
    """
    context = client_tls_context(tls) if tls is not None else None
    auth = NatsAuth.from_environment()
    nc = Client()
    connected = False

    async def on_error(e: Exception) -> None:
        log.warning("nats %s: %s: %s", name, type(e).__name__, e)
        if not connected and _is_refusal(e):
            # nats-py retries these forever; on the first connection they mean a wrong
            # password or certificate: raised here, out of connect(), so the process says so.
            raise BrokerRefused(f"NATS at {url} refused {name}: {e}") from e

    async def on_disconnected() -> None:
        if not nc.is_closed:  # an intentional close() is not worth a warning
            log.warning("nats %s: disconnected from %s, reconnecting", name, url)

    async def on_reconnected() -> None:
        log.info("nats %s: reconnected to %s", name, url)

    security: dict = {}
    if context is not None:
        security = {"tls": context}
        if tls.server_name:
            security["tls_hostname"] = tls.server_name
    if auth is not None:
        security |= _credentials(auth, lambda: _require_tls(nc, context, url))
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
                **security,
            )
            break
        # Network boundary: the broker may not be up yet; retry until the deadline.
        except (TimeoutError, nats.errors.NoServersError, OSError) as e:
            if time.monotonic() > deadline:
                raise ConnectionError(f"cannot reach NATS at {url}: {e}") from e
            await asyncio.sleep(reconnect_wait_s)
        except BrokerRefused:
            await _abandon(nc)
            raise
    try:
        _require_tls(nc, context, url)  # also without credentials: TLS was asked for
    except InsecureBroker:
        await _abandon(nc)
        raise
    connected = True
    return nc


async def _abandon(nc: Client) -> None:
    """Close a client whose connection was refused; nats-py's close() can wait forever on a
    transport that failed half-way through a TLS handshake, so it gets two seconds."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(nc.close(), 2.0)


def _is_refusal(error: Exception) -> bool:
    return (
        isinstance(error, ssl.SSLError | nats.errors.AuthorizationError)
        or "Authorization Violation" in str(error)
        or "TLS Required" in str(error)
    )


def _credentials(auth: NatsAuth, check: Callable[[], None]) -> dict:
    """nats-py connect options that hand each secret over only after `check()` passed (it
    runs when the CONNECT is written, after any TLS upgrade)."""

    def guarded(value: str) -> Callable[[], str]:
        def give() -> str:
            check()
            return value

        return give

    if auth.token:
        return {"token": guarded(auth.token)}
    return {"user": auth.user, "password": guarded(auth.password)}


def _require_tls(nc: Client, context, url: str) -> None:
    # nats-py upgrades to TLS only when the server's INFO asks for it (tls_required), even
    # with a TLS context; it holds that INFO in the private `_server_info`.
    if context is not None and not nc._server_info.get("tls_required"):
        log.error("nats at %s did not start TLS although [broker.tls] is configured", url)
        raise InsecureBroker(
            f"NATS at {url} did not start TLS although broker.tls.ca_file is set: "
            "refusing to send credentials or data in plain text"
        )
