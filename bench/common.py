"""Shared helpers of the benchmark scripts: the declaration each one makes of itself, print
a table, write bench/results/<name>.json, note the machine's load around a measurement,
time the loopback TCP a weight transfer is measured against. (Random-weight models of a
given shape: demo/random_model.py; a process's memory: common/proc_memory.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

RESULTS_DIR = Path(__file__).parent / "results"
CHUNK = 16 * 2**20
"""Bytes per socket write and read of the loopback stream."""


TARGETS = ("bench", "bench-scale", "bench-agentic", "by hand")
"""The make target that runs a benchmark, or `by hand`: `python -m bench.NAME`, for one that
takes long, needs a GPU, or is measured with arguments docs/benchmarks.md names."""


@dataclass(frozen=True)
class Benchmark:
    """What a benchmark module declares of itself, as `BENCHMARK = Benchmark(...)` with
    literal arguments (bench/runner.py reads it from the file, without importing it)."""

    measures: str
    """What it measures, in a line."""
    target: str
    """One of TARGETS."""
    minutes: float
    """About how long it takes on 2 cores."""

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"target: expected one of {TARGETS}, got {self.target!r}")


def machine() -> str:
    """The host a figure came from: architecture, CPU model, CPUs, and whether bf16 is
    native (`native_cpu_bf16`: without it torch emulates bf16, several times slower than
    fp32). Hosts differ from run to run (and from CI's), and bf16 speed with them."""
    from learner.trainer.model_init import native_cpu_bf16

    model = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
                break
    bf16 = "native bf16" if native_cpu_bf16() else "bf16 emulated"
    return ", ".join(
        part for part in (platform.machine(), model, f"{os.cpu_count()} CPUs", bf16) if part
    )


def print_table(title: str, rows: list[tuple[str, object]]) -> None:
    width = max(len(name) for name, _ in rows)
    print(f"\n{title}\n" + "-" * (width + 24))
    for name, value in rows:
        shown = f"{value:,.3f}" if isinstance(value, float) else f"{value}"
        print(f"{name:<{width}}  {shown:>20}")


def write_results(name: str, figures: dict[str, float | int | str]) -> Path:
    """Write a flat object of named figures plus when and where they were measured."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    record = dict(figures)
    record["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if commit := source_commit():
        record["commit"] = commit
    record["machine"] = machine()
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {path}")
    return path


def source_commit() -> str | None:
    """The checkout's commit (`+changes` when tracked files differ from it): which code a
    figure came from. None outside a git checkout."""
    repo = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise OSError(done.stderr)
        return done.stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return None
    return head + ("+changes" if changed else "")


def report(name: str, title: str, figures: dict[str, float | int | str]) -> Path:
    """Print every figure (sorted by name) under `title`, and write them (`write_results`)."""
    print_table(title, [(key, figures[key]) for key in sorted(figures)])
    return write_results(name, figures)


@contextlib.contextmanager
def load_average() -> Iterator[dict[str, float]]:
    """The 1-minute load average before and after the block, as the figures
    `load_avg_1m_before` and `load_avg_1m_after` (the latter filled when the block ends):
    timings from a shared machine are read with the load they ran under."""
    loads = {"load_avg_1m_before": os.getloadavg()[0]}
    yield loads
    loads["load_avg_1m_after"] = os.getloadavg()[0]


def send_bytes(port: int, nbytes: int) -> int:
    """Write `nbytes` into one TCP connection to 127.0.0.1:`port`; the bytes written."""
    payload = memoryview(bytearray(min(nbytes, CHUNK)))
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as stream:
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while sent < nbytes:
            count = min(len(payload), nbytes - sent)
            stream.sendall(payload[:count])
            sent += count
    return sent


def loopback_bytes_per_s(
    nbytes: int = 512 * 2**20, send: Callable[[int, int], object] = send_bytes
) -> float:
    """One TCP stream over 127.0.0.1 into this process, bytes per second from its accept to
    its last byte read. `send(port, nbytes)` writes it: a thread of this process by default,
    or another process (the weight-sync bench's sender, as the learner's rank 0 would)."""
    listener = socket.create_server(("127.0.0.1", 0))
    timed: list[tuple[float, int]] = []

    def receive() -> None:
        connection, _ = listener.accept()
        started, buffer, received = time.perf_counter(), bytearray(CHUNK), 0
        with connection:
            while (count := connection.recv_into(buffer)) > 0:
                received += count
        timed.append((time.perf_counter() - started, received))

    thread = threading.Thread(target=receive)
    thread.start()
    try:
        send(listener.getsockname()[1], nbytes)
    except BaseException:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the receiver's accept
        raise
    finally:
        thread.join()
        listener.close()
    seconds, received = timed[0]
    assert received == nbytes, (received, nbytes)
    return nbytes / seconds
