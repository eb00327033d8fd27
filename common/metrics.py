"""The HTTP endpoint every process serves: Prometheus `/metrics`, and the probes a cluster
engine (Kubernetes, Ray) asks on the same port.

    GET /metrics   Prometheus text format (the process's default registry)
    GET /healthz   200 while the process serves (liveness)
    GET /readyz    200 once the role says it is ready (`ready()` is true), else 503

Each role declares its own metrics with prometheus_client at module level; this module only
starts the server, on a chosen or free port, and reports where it listens. `ready` is a
callable the server asks on every /readyz (from its own thread: it must only read state).
Without one, the process is ready as soon as it serves.
"""

from __future__ import annotations

import errno
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import prometheus_client
from prometheus_client import CollectorRegistry

HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never keeps the process alive


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass  # one line per scrape and probe would drown the role's own log


def health_app(
    metrics_app: Callable, ready: Callable[[], bool] | None
) -> Callable[[dict, Callable], Iterable[bytes]]:
    """A WSGI app: the probes at /healthz and /readyz, everything else to `metrics_app`."""

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == HEALTH_PATH:
            return _text(start_response, "200 OK", "ok\n")
        if path == READY_PATH:
            if ready is None or ready():
                return _text(start_response, "200 OK", "ready\n")
            return _text(start_response, "503 Service Unavailable", "not ready\n")
        return metrics_app(environ, start_response)

    return app


def _text(start_response: Callable, status: str, body: str) -> list[bytes]:
    data = body.encode()
    start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(data)))])
    return [data]


class PortInUse(ValueError):
    """The configured port is taken on this machine (a config problem: another port, or 0
    for a free one, fixes it; retrying does not)."""


def serve_metrics(
    port: int,
    host: str = "127.0.0.1",
    *,
    ready: Callable[[], bool] | None = None,
    registry: CollectorRegistry = prometheus_client.REGISTRY,
    setting: str = "metrics_port",
) -> int:
    """Start /metrics, /healthz and /readyz in a daemon thread; port 0 picks a free one.
    `host` "0.0.0.0" listens on every interface (a cluster's scrapers and probes come from
    outside the pod). Returns the port actually bound. PortInUse names the port and
    `setting`, the config key that chose it, when the port is taken."""
    app = health_app(prometheus_client.make_wsgi_app(registry), ready)
    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    try:
        server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    except OSError as e:
        if e.errno not in _TAKEN:
            raise
        raise _in_use(port, host, setting, e) from None
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server.server_port


def require_free_port(port: int, host: str = "127.0.0.1", *, setting: str) -> None:
    """PortInUse (naming `setting`) unless `port` can be bound on `host` now: a check before
    anything heavy starts, for a server that binds the port later (0 always passes)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            probe.bind((host, port))
        except OSError as e:
            if e.errno in _TAKEN:
                raise _in_use(port, host, setting, e) from None
            # Anything else (an address not on this machine) is the server's to report.


_TAKEN = (errno.EADDRINUSE, errno.EACCES)


def _in_use(port: int, host: str, setting: str, error: OSError) -> PortInUse:
    return PortInUse(
        f"port {port} on {host} is not free ({error.strerror}): set {setting} to a free "
        "port (0 picks one)"
    )


def serve_health(port: int, host: str = "127.0.0.1", *, setting: str = "metrics_port") -> int:
    """Only the probes (and an empty /metrics): for a process whose metrics another one
    reports, such as a learner rank other than 0 that runs alone in its pod."""
    registry = CollectorRegistry(auto_describe=True)
    return serve_metrics(port, host, registry=registry, setting=setting)
