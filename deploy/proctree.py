"""The machine's processes as the launcher, the soak and the fault tests see them: parent,
process group, session, resident memory and command line of each, read from /proc (Linux).

A launcher starts every role in a session of its own, so "everything that role started" is
exactly the processes of that session: what a restart must clear away first (a killed actor
leaves its vLLM engines behind; they would hold their memory for ever) and what a memory
report sums up.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    rss_bytes: int
    command: str
    """argv joined by spaces (the process title for those that set one, e.g. VLLM::...)."""


def parse_stat(text: str) -> tuple[int, int, int, int]:
    """(ppid, pgid, sid, rss pages) from the text of /proc/<pid>/stat. The command name in
    parentheses may itself hold spaces and parentheses, so fields count from the last ')'."""
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is the state; then ppid, pgrp, session, ...; rss is field 24 of stat(5).
    return int(fields[1]), int(fields[2]), int(fields[3]), int(fields[21])


def read_proc(pid: int, root: Path = Path("/proc")) -> ProcInfo | None:
    """One process, or None if it is gone (or a kernel thread without a command line)."""
    try:
        stat = (root / str(pid) / "stat").read_text()
        raw = (root / str(pid) / "cmdline").read_bytes()
    except OSError:  # exited meanwhile, or not ours to read
        return None
    ppid, pgid, sid, rss_pages = parse_stat(stat)
    command = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    return ProcInfo(pid, ppid, pgid, sid, rss_pages * PAGE_BYTES, command)


def processes(root: Path = Path("/proc")) -> dict[int, ProcInfo]:
    """Every readable process, by pid."""
    out = {}
    for entry in root.iterdir():
        if entry.name.isdigit() and (info := read_proc(int(entry.name), root)) is not None:
            out[info.pid] = info
    return out


def in_session(sid: int, table: dict[int, ProcInfo] | None = None) -> list[ProcInfo]:
    """The live processes of session `sid` (zombies, whose memory is gone, included)."""
    table = processes() if table is None else table
    return [p for p in table.values() if p.sid == sid]


def descendants(pid: int, table: dict[int, ProcInfo] | None = None) -> list[ProcInfo]:
    """Children, grandchildren, ... of `pid` (breadth first)."""
    table = processes() if table is None else table
    out, frontier = [], [pid]
    while frontier:
        children = [p for p in table.values() if p.ppid in frontier]
        out += children
        frontier = [p.pid for p in children]
    return out


def kill_session(sid: int, signum: int = signal.SIGKILL) -> list[int]:
    """Signal every process of session `sid`; returns their pids. Only for sessions this
    process created (a launcher's children each lead one)."""
    assert sid != os.getsid(0), "refusing to signal our own session"
    signalled = []
    for proc in in_session(sid):
        try:
            os.kill(proc.pid, signum)
            signalled.append(proc.pid)
        except ProcessLookupError:
            pass  # exited meanwhile
    return signalled
