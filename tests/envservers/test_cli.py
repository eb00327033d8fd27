"""The `envserver` entry point as a user runs it: fast --help, clear config errors, the
flags fixed, and a graceful SIGTERM (health NOT_SERVING, new sessions refused, the step in
flight finishes, exit 0)."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from envservers.cli import parse_args
from protos.client import EnvClient

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _envserver(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "envservers.cli", *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,
    )


def test_help_is_fast_and_imports_nothing_heavy():
    start = time.monotonic()
    result = _envserver("--help")
    assert result.returncode == 0 and "--config" in result.stdout
    assert time.monotonic() - start < 3
    probe = (
        "import sys; from envservers import cli; cli.load_config(cli.parse_args([]));"
        "print(sorted(m for m in ('grpc', 'torch', 'mcp', 'skyrl_gym') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_bad_config_fails_fast_with_the_field(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[envserver]\nport = "high"\nenvz = ["calculator"]\n')
    result = _envserver("--config", str(config))
    assert result.returncode == 2
    assert "envserver.port" in result.stderr and "envserver.envz" in result.stderr
    result = _envserver("--env", "mcp", "--port", "0")
    assert result.returncode == 2 and "mcp" in result.stderr


def test_flags_are_fixed():
    args = parse_args(
        [
            "--config",
            "c.toml",
            "--env",
            "calculator",
            "--env",
            "sql",
            "--port",
            "5",
            "--host",
            "0.0.0.0",
            "envserver.max_sessions=3",
        ]
    )
    assert vars(args) == {
        "config": "c.toml",
        "env": ["calculator", "sql"],
        "port": 5,
        "host": "0.0.0.0",
        "overrides": ["envserver.max_sessions=3"],
    }


async def test_sigterm_drains_then_finishes_in_flight_steps(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[envserver]\nmetrics_port = 0\ndrain_s = 1.0\nshutdown_grace_s = 10\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "envservers.cli",
        "--config",
        str(config),
        "--env",
        "slow=tests.envservers.fakes:SlowProvider",  # a user's environment, by import path
        "--port",
        "0",
        cwd=REPO,
        env=ENV,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("envserver ready on "), line
        address = line.split()[3]
        async with (
            EnvClient(address, max_retries=0) as client,
            grpc.aio.insecure_channel(address) as channel,
        ):
            session = await client.open("slow", {})
            in_flight = asyncio.create_task(session.step("1.5"))
            await asyncio.sleep(0.3)
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            try:
                await client.open("slow", {})
                raise AssertionError("a new session was accepted while draining")
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE
            result = await in_flight
            assert result.observations == [{"role": "user", "content": "1.5"}]
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_shipped_config_is_valid():
    from common.config import load_section
    from envservers.config import EnvServerConfig

    config = load_section(EnvServerConfig, REPO / "configs" / "envserver.toml", "envserver")
    assert "calculator" in config.envs and config.mcp.servers["time"].command == "python"
