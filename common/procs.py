"""Process plumbing every launcher and test needs: a free loopback port, a wait for a port
to listen, and children that die with their parent.
"""

from __future__ import annotations

import ctypes
import secrets
import signal
import socket
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """`preexec_fn` for children: the kernel sends them SIGTERM when their parent dies, so
    a launcher killed with SIGKILL still leaves no server or port behind (Linux only)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
NUM_TRIES = 64


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody uses right now, for a server that binds it a little later. It is chosen
    below the kernel's ephemeral range: a port from that range (what binding port 0 gives)
    can meanwhile become the local port of any outgoing connection on the machine, and stays
    taken while that connection lives (an env server's metrics port was, through ten
    restarts of the fault suite's run). A race with another process that binds the same
    port first is possible but rare."""
    low = ephemeral_range()[0]
    first = max(1024, low - 16384)
    for _ in range(NUM_TRIES if low > first else 0):
        port = first + secrets.randbelow(low - first)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue  # in use: another one
        return port
    with socket.socket() as s:  # all taken (unlikely): let the kernel pick
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout_s: float, what: str) -> None:
    """Until something listens on host:port; RuntimeError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {host}:{port} in {timeout_s:.0f}s")


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux's default where unknown)."""
    try:
        low, high = Path(EPHEMERAL_RANGE_FILE).read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM (the handlers are installed now, in the main
    thread): a foreground loop polls it to stop cleanly."""
    stop = threading.Event()

    def handler(signum, frame) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop
