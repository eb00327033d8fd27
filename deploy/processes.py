"""Child processes of a launcher: started in their own sessions with logs to files, and
stopped by PID (SIGTERM to the process group, then SIGKILL after a grace period), so that
Ctrl-C or a crash leaves nothing running and no port taken.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.procs import die_with_parent
from deploy import proctree


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def log_tail(self, num_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except FileNotFoundError:
            return ""


@dataclass
class ProcessGroup:
    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,  # its own process group: we signal it, not the tty
                preexec_fn=die_with_parent,
            )
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def failed(self) -> Child | None:
        """The first child that exited with a non-zero code, if any."""
        for child in self.children:
            if child.returncode not in (None, 0):
                return child
        return None

    def stop_all(self, grace_s: float = 15.0) -> None:
        """SIGTERM every child's process group (newest first), then SIGKILL what remains of
        each child's session (processes that moved to process groups of their own, such as
        actor replicas, included)."""
        for child in reversed(self.children):
            _signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in reversed(self.children):
            remaining = max(0.0, deadline - time.monotonic())
            try:
                child.process.wait(remaining)
            except subprocess.TimeoutExpired:
                pass
            # Kill the whole session even if the leader exited: its workers may linger.
            _signal_group(child.process, signal.SIGKILL)
            child.process.wait()
            proctree.kill_session(child.process.pid)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass  # already gone
