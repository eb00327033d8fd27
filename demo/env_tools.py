"""The demo task's tool specs, asked of a real env server through its public interface.

A rebuild of the tiny model renders the tools into every demonstration's system turn; they
must be exactly the text the env server will hand the actors at reset(). The demo kit does
not import the env server's code (a role): it starts `envserver --env calculator` as a
process, resets one demo row over gRPC, reads the tools offered, and stops the server.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import grpc

from common.procs import die_with_parent, free_port
from demo.data import make_rows
from protos.client import EnvClient

STARTUP_TIMEOUT_S = 60.0


def fetch_demo_tools() -> list[dict]:
    """The specs a calculator env server offers for a demo row (`extra_info.tools`)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "envservers.cli", "--env", "calculator", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )
    try:
        return asyncio.run(_reset_once(f"127.0.0.1:{port}", server))
    finally:
        server.terminate()
        server.wait(timeout=30)


async def _reset_once(address: str, server: subprocess.Popen) -> list[dict]:
    row = make_rows(1, seed=0)[0]
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    async with EnvClient(address, timeout_s=5.0, max_retries=0) as client:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"envserver exited: {server.stderr.read().decode()[-2000:]}")
            try:
                session = await client.open(row["env_class"], row)
                break
            # Network boundary: the server is not listening yet; retry until the deadline.
            except grpc.aio.AioRpcError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        await session.close()
        return session.observation.tools
