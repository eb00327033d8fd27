"""A process's resident memory as Linux reports it in /proc: its current size (VmRSS), its
high-water mark (VmHWM), and a reset of that mark, so a measurement sees only what the code
under it adds (`getrusage`'s `ru_maxrss` cannot be reset: a temporary freed before the
measurement, or a parent's peak across fork + exec, would hide it).

The benchmarks (bench/: a step's, a head's, a role's peak) and the harness that holds an
engine's memory during a weight update to its bound (deploy/engine_memory.py) read it here,
so they read one file one way, in one unit (kB as the kernel writes it; MiB for a table).
"""

from __future__ import annotations

from pathlib import Path


def status_kb(pid: int | str = "self") -> dict[str, int]:
    """The sizes in /proc/PID/status (this process's by default), in kB, by field (`VmRSS`,
    `VmHWM`, ...), read at once so they agree. A zombie has none of the `Vm` fields."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        field, _, value = line.partition(":")
        number, _, unit = value.strip().partition(" ")
        if unit == "kB":
            values[field] = int(number)
    return values


def status_mib(field: str, pid: int | str = "self") -> float:
    """One `status_kb` field (`VmRSS`, `VmHWM`) of process `pid`, in MiB; RuntimeError when
    the process has no such field (a zombie)."""
    values = status_kb(pid)
    if field not in values:
        raise RuntimeError(f"no {field} in /proc/{pid}/status")
    return values[field] / 1024


def reset_peak(pid: int | str = "self") -> dict[str, int]:
    """Reset process `pid`'s VmHWM to its current VmRSS (`echo 5 > /proc/PID/clear_refs`)
    and return its `status_kb` right after: the size the measurement starts from."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return status_kb(pid)
