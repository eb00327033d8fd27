"""Process plumbing every launcher and test needs: a free loopback port, and children that
die with their parent.
"""

from __future__ import annotations

import ctypes
import signal
import socket
import sys
import threading

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """`preexec_fn` for children: the kernel sends them SIGTERM when their parent dies, so
    a launcher killed with SIGKILL still leaves no server or port behind (Linux only)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it; a race with another process
    binding it before the caller is possible but rare)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM (the handlers are installed now, in the main
    thread): a foreground loop polls it to stop cleanly."""
    stop = threading.Event()

    def handler(signum, frame) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop
