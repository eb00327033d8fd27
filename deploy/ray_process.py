"""One process of a Tether run inside a Ray actor (`RoleProcess`), and the plumbing around
it: the run's events file, the environment marker that finds every process of the run, and
a task that finds free ports on a node.

A RoleProcess runs its command as a child process in a session of its own and lives exactly
as long as it: when the child dies of anything but a clean exit, the actor kills what is
left of the child's process tree and exits its worker, and Ray restarts the actor
(`max_restarts`) in the same placement group bundle, on the same node: the constructor
starts the command again, on the same ports. So Ray alone restarts nats-server, env servers
and actor replicas, whether the process crashed, was killed, or its Ray worker died; nothing
of ours has to be alive for it. Learner ranks are RoleProcesses too, but Ray does not
restart them (deploy/ray_supervisor.py restarts all ranks together).

Every process started for the run carries `TETHER_RAY_PROCESS=<run>/<name>` in its
environment, vLLM's renamed engine processes included, so a stop (or a restart after a
worker died) finds and kills all of them by PID, not only the child it started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import ray

from common.procs import die_with_parent, free_port
from deploy.ray_commands import PYTHON

MARKER = "TETHER_RAY_PROCESS"
"""Environment variable on every process of a run: `<run id>/<process name>`."""
CRASH_LOOP_S = 30.0
"""A process that exits sooner than this after its start ..."""
CRASH_LOOP_BACKOFF_S = 10.0
"""... is restarted after this pause (Ray restarts an actor at once)."""


def append_event(path: str | Path, **event) -> None:
    """One JSON line in the run's events.jsonl (one write: lines do not interleave)."""
    line = json.dumps({"t": round(time.time(), 3), **event}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def marked_pids(marker: str) -> list[int]:
    """PIDs of this machine's processes whose environment holds `MARKER=marker`."""
    needle = f"\0{MARKER}={marker}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours
        if needle in b"\0" + environ + b"\0":
            found.append(int(entry.name))
    return found


def kill_marked(marker: str, signum: int = signal.SIGKILL) -> list[int]:
    pids = marked_pids(marker)
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    return pids


class RoleProcess:
    """One process of the run (its command, as a child of this actor's worker)."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.marker = f"{spec['run_id']}/{self.name}"
        self.process: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.started_at: float | None = None
        self.stopping = False
        self._lock = threading.Lock()
        context = ray.get_runtime_context()
        self.node_id = context.get_node_id()
        self.ip = ray.util.get_node_ip_address()
        self.restarted = bool(context.was_current_actor_reconstructed)
        # A worker that died may have left its process tree behind (the child is told by
        # PDEATHSIG, its children are not): nothing of the old incarnation may hold a port.
        left = kill_marked(self.marker)
        if left:
            self._event("reaped", pids=left)
        if spec.get("autostart", True):
            self.start({})

    def _event(self, event: str, **fields) -> None:
        append_event(self.spec["events"], role=self.name, event=event, node=self.ip, **fields)

    def placement(self) -> dict:
        """Where Ray put this actor, and which GPUs it was given."""
        return {
            "node_id": self.node_id,
            "ip": self.ip,
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        }

    def start(self, extra_env: dict[str, str]) -> int:
        argv = list(self.spec["argv"])
        if argv[0] == PYTHON:
            argv[0] = sys.executable  # this node's interpreter, the one Ray runs
        # Not a Ray process: none of the worker's RAY_* settings, our marker instead.
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(self.spec.get("env", {}))
        env.update(extra_env)
        env[MARKER] = self.marker
        log_path = Path(self.spec["log"])
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            log.write(
                f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {self.name} on {self.ip}"
                f"{' (restarted by Ray)' if self.restarted else ''}: {' '.join(argv)}\n".encode()
            )
            log.flush()
            self.process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.spec["cwd"],
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.started_at = time.time()
        self._event("started", pid=self.process.pid, restarted=self.restarted)
        threading.Thread(target=self._watch, name=f"watch-{self.name}", daemon=True).start()
        return self.process.pid

    def _watch(self) -> None:
        code = self.process.wait()
        with self._lock:
            self.returncode = code
            stopping = self.stopping
        _kill_group(self.process.pid)
        kill_marked(self.marker)  # what left the group (vLLM's engine) goes too
        self._event("exited", pid=self.process.pid, code=code, stopping=stopping)
        if code != 0 and not stopping and self.spec.get("restart_on_crash", True):
            # The actor's life is its process's: a crash ends the worker, and Ray restarts
            # the actor (max_restarts) in its bundle, which starts the command again. A
            # process that died young (a bad config, a port taken) waits first: no hot loop.
            lived = time.time() - (self.started_at or 0)
            if lived < CRASH_LOOP_S:
                time.sleep(CRASH_LOOP_BACKOFF_S)
            os._exit(1)

    def info(self) -> dict:
        return {
            "name": self.name,
            "pid": self.process.pid if self.process else None,
            "returncode": self.returncode,
            "started_at": self.started_at,
            "node_id": self.node_id,
            "ip": self.ip,
            "restarted": self.restarted,
        }

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM the process tree, SIGKILL what is left after `grace_s`; no restart."""
        with self._lock:
            self.stopping = True
        if self.process is not None and self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        if self.process is not None:
            _kill_group(self.process.pid)
            self.process.wait()
        deadline = time.monotonic() + 10
        while kill_marked(self.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.process.returncode if self.process else None


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(pid: int) -> None:
    _signal_group(pid, signal.SIGKILL)


@ray.remote(num_cpus=0)
def free_ports_on_node(count: int) -> list[int]:
    """`count` distinct free ports on the node this task runs on."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port(ray.util.get_node_ip_address())
        if port not in ports:
            ports.append(port)
    return ports
