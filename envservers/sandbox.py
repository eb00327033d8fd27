"""Run model-written Python in a sandbox, asynchronously (server side of the launcher).

    Sandbox(config)       one per session: a scratch dir owned by a uid of its own
    await sandbox.run(code, timeout_s) -> RunResult(exit_code, output, killed)
    await sandbox.close() removes the scratch dir

What is enforced (namespaces mode, as root — see sandbox_launcher.py for how): wall-clock
timeout that SIGKILLs the process group (and the pid namespace with it; the run returns
only once no process of its uid is left); RLIMIT_CPU,
RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_NOFILE; no network namespace devices up; a
read-only root holding only the interpreter, the system libraries and the scratch dir;
an unprivileged uid; output capped at `max_output_bytes` (the run is killed past it, and the
output it wrote so far ends with a marker saying so).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from envservers.config import SandboxConfig

LAUNCHER = Path(__file__).with_name("sandbox_launcher.py")
log = logging.getLogger(__name__)
_uids = itertools.count()


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None  # None when killed by us
    output: str  # stdout and stderr, interleaved, capped
    killed: str | None = None  # why we killed it: "timeout" | "output limit"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed is None


def processes_of(uid: int) -> list[int]:
    """PIDs of the live (or not yet reaped) processes whose real uid is `uid` (Linux)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                line = next(line for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue  # exited meanwhile
        if int(line.split()[1]) == uid:
            pids.append(int(entry.name))
    return pids


def scratch_root(config: SandboxConfig) -> Path:
    return Path(config.scratch_root or Path(tempfile.gettempdir()) / "tether-sandbox")


class Sandbox:
    def __init__(self, config: SandboxConfig):
        self.config = config
        self.uid = config.uid_base + next(_uids) % config.uid_pool
        base = scratch_root(config)
        base.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="session-", dir=base))
        self.scratch = self.dir / "scratch"
        self.root = self.dir / "root"  # empty mount point for the sandbox's own root
        self.scratch.mkdir(mode=0o700)
        self.root.mkdir()
        if os.getuid() == 0:
            os.chown(self.scratch, self.uid, self.uid)

    def _spec(self, argv: list[str]) -> dict:
        c = self.config
        return {
            "mode": c.isolation,
            "scratch": str(self.scratch),
            "root": str(self.root),
            "uid": self.uid,
            "python": os.path.realpath(sys.executable),
            "prefix": os.path.realpath(sys.base_prefix),
            "ro_paths": [os.path.realpath(p) for p in c.ro_paths],
            "argv": argv,
            "limits": {
                "cpu_s": c.cpu_s,
                "memory_mb": c.memory_mb,
                "file_size_mb": c.file_size_mb,
                "max_processes": c.max_processes,
                "max_open_files": c.max_open_files,
            },
        }

    def _write_program(self, code: str) -> None:
        """Write `code` to scratch/main.py. An earlier run may have left anything at that
        path (a symlink to a host file, a directory): it is removed without being followed,
        and the new file is created so that no link is followed (this runs as root)."""
        main = self.scratch / "main.py"
        try:
            main.unlink()  # a symlink itself goes, never its target
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            shutil.rmtree(main)  # does not follow symlinks inside
        fd = os.open(main, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(code)
            if os.getuid() == 0:
                os.fchown(f.fileno(), self.uid, self.uid)

    async def _reap(self, timeout_s: float = 10.0) -> None:
        """Namespaces mode: wait until no process of the run's own uid is left. The pid
        namespace dies with its pid 1, but the kernel takes a moment (about 2 s for 40
        spinning threads here) to kill the rest; whatever remains after `timeout_s` is
        killed by pid. Never in rlimits mode, whose runs share the server's uid."""
        if self.config.isolation != "namespaces":
            return
        deadline, killed = time.monotonic() + timeout_s, False
        while pids := processes_of(self.uid):
            if time.monotonic() > deadline:
                if killed:  # SIGKILLed a while ago and still there: not ours to wait on
                    log.warning("sandbox uid %d: processes %s outlived SIGKILL", self.uid, pids)
                    return
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                deadline, killed = time.monotonic() + 2.0, True  # the kernel takes a moment
            await asyncio.sleep(0.05)

    async def run(self, code: str, timeout_s: float | None = None) -> RunResult:
        """Write `code` to the scratch dir as main.py and run it confined."""
        self._write_program(code)
        timeout = min(timeout_s or self.config.timeout_s, self.config.timeout_s)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            str(LAUNCHER),
            json.dumps(self._spec(["main.py"])),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        killed = None
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout(timeout):
                size = 0
                while chunk := await proc.stdout.read(65536):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > self.config.max_output_bytes:
                        killed = "output limit"
                        break
                if killed is None:
                    await proc.wait()
        except TimeoutError:
            killed = "timeout"
        finally:  # whatever happened (even cancellation), nothing of the run survives it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            await self._reap()
        limit = self.config.max_output_bytes
        output = b"".join(chunks)[:limit].decode("utf-8", "replace")
        if killed == "output limit":
            output += (
                f"\n[... output cut at {limit} bytes: the program was killed for writing more]"
            )
        return RunResult(None if killed else proc.returncode, output, killed)

    async def close(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.dir, True)
