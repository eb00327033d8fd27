"""Connect to NATS the way every long-lived Tether process should: wait a bounded time for
a broker that is not up yet (saying so once, then every ~30 s), then reconnect forever and
never die because the broker restarted.

    wait_for_broker: TCP to the URL's host:port, backoff 0.25 s doubling to 5 s; a line
      "waiting for NATS at URL (is `python -m broker serve` running?)" at the first refusal,
      then every 30 s; BrokerUnreachable after `broker.connect_timeout_s`
    nc.connect (nats-py): CONNECT, credentials, TLS; reconnect forever once connected

nats-py itself retries a first connection that fails inside `Client.connect` for ever,
every `reconnect_time_wait`, whatever `allow_reconnect` and `max_reconnect_attempts` say
(nats-io/nats.py#645): the bound and the backoff are ours, before it is called.

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
import urllib.parse
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client

from broker.config import BrokerConfig, BrokerTlsConfig
from broker.limits import MAX_PAYLOAD_BYTES
from broker.security import BrokerRefused, InsecureBroker, NatsAuth, client_tls_context
from common.waiting import LOG_EVERY_S, Waiting

log = logging.getLogger(__name__)


# The client's read buffer must hold several max-size messages in flight.
PENDING_SIZE_BYTES = 16 * MAX_PAYLOAD_BYTES
PROBE_TIMEOUT_S = 2.0
"""Longest one TCP attempt to the broker takes (a host that drops packets)."""
DEFAULT_CONNECT_TIMEOUT_S = 300.0
"""`broker.connect_timeout_s`'s default (broker/config.py says why)."""
HINT = "is `python -m broker serve` running?"


class BrokerUnreachable(ConnectionError):
    """Nothing answered at the broker's address within `broker.connect_timeout_s`."""


async def connect(
    url: str,
    *,
    name: str,
    tls: BrokerTlsConfig | None = None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    reconnect_wait_s: float = 0.5,
) -> Client:
    """Connect with reconnect-forever semantics.

    The first connection waits up to `connect_timeout_s` for the broker (a process may start
    before it), then raises BrokerUnreachable; once connected, the client reconnects forever
    and logs each disconnect. BrokerRefused (wrong credentials or certificate) and
    InsecureBroker are raised at once: retrying cannot fix them.
    """
    deadline = time.monotonic() + connect_timeout_s
    await wait_for_broker(url, timeout_s=connect_timeout_s, name=name)
    context = client_tls_context(tls) if tls is not None else None
    auth = NatsAuth.from_environment()
    nc = Client()
    connected = False
    said_at = [float("-inf")]

    async def on_error(e: Exception) -> None:
        if connected or time.monotonic() - said_at[0] >= LOG_EVERY_S:
            said_at[0] = time.monotonic()  # before the first connection: every 30 s at most
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
    options = dict(
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
    try:
        # nats-py retries inside connect() for ever (the broker went away again since the
        # probe answered): the rest of our deadline bounds it, at least one attempt's worth.
        await asyncio.wait_for(nc.connect(**options), max(deadline - time.monotonic(), 5.0))
    except TimeoutError:
        await _abandon(nc)
        raise BrokerUnreachable(_gave_up(url, connect_timeout_s, "no CONNECT answered")) from None
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


async def connect_to(broker: BrokerConfig, *, name: str) -> Client:
    """`connect` as the `[broker]` section says: its URL, TLS and connect timeout."""
    return await connect(
        broker.url, name=name, tls=broker.tls, connect_timeout_s=broker.connect_timeout_s
    )


async def wait_for_broker(url: str, *, timeout_s: float, name: str = "") -> None:
    """Return once something accepts TCP at the broker URL's host:port; until then back off
    and say so (common/waiting.py). BrokerUnreachable after `timeout_s`."""
    host, port = broker_address(url)
    waiting = Waiting(started_at=time.monotonic(), timeout_s=timeout_s)
    while True:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_TIMEOUT_S)
        # Network boundary: refused, unreachable, no such host (yet), or silent: try again.
        except OSError as e:
            reason = str(e) or type(e).__name__
            step = waiting.failed(time.monotonic())
            if step.give_up:
                raise BrokerUnreachable(_gave_up(url, timeout_s, reason)) from None
            if step.say:
                first = waiting.num_failures == 1
                still = "waiting" if first else f"still waiting ({step.waited_s:.0f}s)"
                log.warning(
                    "%s%s for NATS at %s (%s) [%s]; "
                    "giving up after %.0fs (broker.connect_timeout_s)",
                    f"{name}: " if name else "",
                    still,
                    url,
                    HINT,
                    reason,
                    timeout_s,
                )
            await asyncio.sleep(step.delay_s)
            continue
        writer.close()
        if waiting.num_failures:
            log.info("NATS at %s answers now", url)
        return


def broker_address(url: str) -> tuple[str, int]:
    """(host, port) of a nats:// or tls:// URL (port 4222 when it names none)."""
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 4222


def _gave_up(url: str, timeout_s: float, reason: str) -> str:
    return (
        f"NATS at {url} did not answer within {timeout_s:.0f}s (broker.connect_timeout_s) "
        f"[{reason}]: {HINT}"
    )


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
