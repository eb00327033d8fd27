"""Run a worker script as two torch.distributed ranks (gloo on loopback), wait for both, and
fail with the log of the rank that failed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from common.procs import free_port

REPO = Path(__file__).resolve().parents[2]


def run_two_ranks(worker_args: list[str], timeout_s: float = 600) -> None:
    """`python <worker_args>` as ranks 0 and 1 of a 2-process group; AssertionError naming
    the rank (with its output) when one exits non-zero."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, *worker_args],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=timeout_s)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{logs[rank][-4000:]}"


def exit_after_teardown() -> None:
    """End a worker once its group is destroyed and its results are written, skipping the
    interpreter's teardown of C++ statics: there torch's gloo/TCPStore threads have been
    seen to abort ("terminate called without an active exception", exit -6) after the work
    was done, about one run in a few hundred on a loaded machine, failing a test about
    weights over an exit code."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
