"""The embedded nats-server launcher and its CLI, as a user runs them."""

import signal
import socket
import subprocess
import sys

import pytest

from broker.server import NatsServer


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_server_context_starts_healthy_with_8mb_payload_and_stops(tmp_path):
    with NatsServer(tmp_path) as server:
        assert _port_open(server.port)
        assert "max_payload: 8388608" in (tmp_path / "nats-server.conf").read_text()
        pid = server.process.pid
    assert not _port_open(server.port)
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)


def test_server_that_cannot_start_reports_its_log(tmp_path):
    with NatsServer(tmp_path / "a") as first:
        clash = NatsServer(tmp_path / "b", port=first.port)
        with pytest.raises(RuntimeError, match="nats-server exited"):
            clash.start(timeout_s=10)


def test_cli_serves_until_sigterm(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "broker", "serve", "--port", "0", "--store-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("nats-server ready at nats://127.0.0.1:"), line
        port = int(line.split()[3].rsplit(":", 1)[1])
        assert _port_open(port)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert not _port_open(port)
    finally:
        if process.poll() is None:
            process.kill()
