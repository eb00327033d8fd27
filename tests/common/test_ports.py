"""A metrics port already taken is one line naming the port and the config key to change
(common/metrics.py), whether found before the start or when the server binds."""

from __future__ import annotations

import socket

import pytest

from common.metrics import PortInUse, require_free_port, serve_metrics


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_taken_port_names_itself_and_the_setting(taken_port):
    expected = (
        f"port {taken_port} on 127.0.0.1 is not free (Address already in use): set "
        "learner.metrics_port to a free port (0 picks one)"
    )
    with pytest.raises(PortInUse) as checked:
        require_free_port(taken_port, setting="learner.metrics_port")
    with pytest.raises(PortInUse) as served:
        serve_metrics(taken_port, setting="learner.metrics_port")
    assert str(checked.value) == str(served.value) == expected


def test_a_free_port_and_port_0_pass():
    require_free_port(0, setting="k")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    require_free_port(port, setting="k")
