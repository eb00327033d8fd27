"""Prometheus metrics endpoint shared by every process (`/metrics`).

Each role declares its own metrics with prometheus_client at module level; this module only
starts the HTTP server, on a chosen or free port, and reports where it listens.
"""

from __future__ import annotations

import prometheus_client


def serve_metrics(port: int, host: str = "127.0.0.1") -> int:
    """Start the /metrics HTTP server in a daemon thread; port 0 picks a free one.
    Returns the port actually bound."""
    server, _thread = prometheus_client.start_http_server(port, addr=host)
    return server.server_port
