"""tether/metrics.py: /metrics, /healthz and /readyz on one real HTTP server per test."""

from __future__ import annotations

import urllib.error
import urllib.request

import prometheus_client

from common.metrics import serve_health, serve_metrics


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_old_call_serves_metrics_and_is_ready_at_once():
    port = serve_metrics(0)
    status, body = _get(port, "/metrics")
    assert status == 200 and "python_info" in body  # the default registry
    assert _get(port, "/healthz") == (200, "ok\n")
    assert _get(port, "/readyz") == (200, "ready\n")


def test_readyz_follows_the_role_and_healthz_does_not():
    state = {"ready": False}
    port = serve_metrics(0, "127.0.0.1", ready=lambda: state["ready"])
    assert _get(port, "/readyz") == (503, "not ready\n")
    assert _get(port, "/healthz")[0] == 200
    state["ready"] = True
    assert _get(port, "/readyz") == (200, "ready\n")
    state["ready"] = False  # e.g. draining, or the bus connection lost
    assert _get(port, "/readyz")[0] == 503


def test_own_registry_and_health_only_server():
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("tether_test_things", "things", registry=registry).inc(3)
    port = serve_metrics(0, registry=registry)
    status, body = _get(port, "/metrics")
    assert status == 200 and "tether_test_things_total 3.0" in body
    assert "python_info" not in body

    port = serve_health(0)
    assert _get(port, "/metrics") == (200, "")
    assert _get(port, "/healthz")[0] == 200 and _get(port, "/readyz")[0] == 200
