"""One process of a Tether run inside a Ray actor (`RoleProcess`), and the plumbing around
it: the environment marker that finds every process of the run, and a task that finds free
ports on a node.

A RoleProcess runs its command as a child process in a session of its own; when the child
dies, the actor clears what is left of its process tree and keeps its exit code for the
run's supervisor (deploy/ray_supervisor.py), which decides about restarts as every Tether
supervisor does (common/supervision.py) and starts a new RoleProcess in the same placement
group bundle, on the same node and ports. Ray itself restarts nothing (`max_restarts` 0):
one budget per role, not Ray's stacked on ours.

Every process started for the run carries `TETHER_RAY_PROCESS=<run>/<name>` in its
environment, vLLM's renamed engine processes included, so a stop (or a restart after a
worker died) finds and kills all of them by PID, not only the child it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import ray

from common.procs import die_with_parent, free_port
from common.supervision import EVENTS_ENV, ROLE_ENV, Events
from deploy.ray_commands import PYTHON

MARKER = "TETHER_RAY_PROCESS"
"""Environment variable on every process of a run: `<run id>/<process name>`."""


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
        self.node_id = ray.get_runtime_context().get_node_id()
        self.ip = ray.util.get_node_ip_address()
        # A worker that died may have left its process tree behind (the child is told by
        # PDEATHSIG, its children are not): nothing of the old process may hold a port.
        left = kill_marked(self.marker)
        if left:
            Events(spec["events"]).write(self.name, "reaped", pids=left, node=self.ip)
        if spec.get("autostart", True):
            self.start({})

    def placement(self) -> dict:
        """Where Ray put this actor, and which GPUs it was given."""
        return {
            "node_id": self.node_id,
            "ip": self.ip,
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        }

    def free_port(self) -> int:
        """A free port on this actor's node (an elastic replica's, known once it is placed)."""
        return free_port(self.ip)

    def start(self, extra_env: dict[str, str], argv: list[str] | None = None) -> int:
        """Start the command (the spec's, or `argv`: an elastic replica's, made once its
        node and port are known)."""
        argv = list(self.spec["argv"] if argv is None else argv)
        if argv[0] == PYTHON:
            argv[0] = sys.executable  # this node's interpreter, the one Ray runs
        # Not a Ray process: none of the worker's RAY_* settings, our marker instead.
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(self.spec.get("env", {}))
        env.update(extra_env)
        env[MARKER] = self.marker
        # A supervisor inside the process (the actor's, of its replicas) writes the run's
        # events too, under this role's name.
        env[EVENTS_ENV], env[ROLE_ENV] = self.spec["events"], self.name
        log_path = Path(self.spec["log"])
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            log.write(
                f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {self.name} on {self.ip}"
                f" (restart {self.spec.get('restart', 0)}): {' '.join(argv)}\n".encode()
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
        threading.Thread(target=self._watch, name=f"watch-{self.name}", daemon=True).start()
        return self.process.pid

    def _watch(self) -> None:
        code = self.process.wait()
        _kill_group(self.process.pid)
        kill_marked(self.marker)  # what left the group (vLLM's engine) goes too
        self.returncode = code  # the supervisor reads it (info) once the tree is gone

    def info(self) -> dict:
        return {
            "name": self.name,
            "pid": self.process.pid if self.process else None,
            "returncode": self.returncode,
            "started_at": self.started_at,
            "node_id": self.node_id,
            "ip": self.ip,
        }

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM the process tree, SIGKILL what is left after `grace_s`; no restart."""
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
