"""The Ray side of a Tether run: one Ray actor per process of the run (`RoleProcess`), and the
run's supervisor (`RunSupervisor`), a named, detached actor on the head node that places
everything and watches it.

    RunSupervisor  "<run>/supervisor"       placement groups, the role actors, the learner's
                                            gang restarts, the end of the run
    RoleProcess    "<run>/nats"             python -m broker serve        (head node)
                   "<run>/envserver-<i>"    envserver --config C          (CPU nodes)
                   "<run>/learner-<rank>"   learner --config C            (GPU nodes)
                   "<run>/actor-<i>"        actor --config C --replicas 1 (GPU nodes)

Restarts. A RoleProcess runs its command as a child process in a session of its own and
lives exactly as long as it: when the child dies of anything but a clean exit, the actor
kills what is left of the child's process tree and exits its worker, and Ray restarts the
actor (`max_restarts`) in the same placement group bundle, on the same node: the constructor
starts the command again, on the same ports. So Ray alone restarts nats-server, env servers
and actor replicas, whether the process crashed, was killed, or its Ray worker died; nothing
of ours has to be alive for it. The learner is the exception: its ranks share one
torch.distributed group, so one rank alone cannot come back. Its rank actors are not
restarted by Ray (`max_restarts=0`); when a rank fails, the supervisor stops every rank and
starts them all again (torchrun's agent does the same), and they resume from the newest
checkpoint (`learner.checkpoint.resume`).

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
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from common.procs import die_with_parent, free_port
from deploy.ray_plan import PYTHON, Plan, Slot, learner_env

MARKER = "TETHER_RAY_PROCESS"
"""Environment variable on every process of a run: `<run id>/<process name>`."""
LABEL_NODE_ID = "ray.io/node-id"
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


def pg_name(namespace: str, run_id: str, what: str) -> str:
    return f"{namespace}/{run_id}/{what}"


def actor_name(run_id: str, what: str) -> str:
    return f"{run_id}/{what}"


class RunSupervisor:
    """Places the run and watches it (a named, detached actor on the head node)."""

    def __init__(self, launch: dict) -> None:
        self.launch = launch
        self.run_id: str = launch["run_id"]
        self.namespace: str = launch["namespace"]
        self.plan = Plan(
            nats=Slot(**launch["plan"]["nats"]),
            envservers=tuple(Slot(**s) for s in launch["plan"]["envservers"]),
            actors=tuple(Slot(**s) for s in launch["plan"]["actors"]),
            learner=tuple(Slot(**s) for s in launch["plan"]["learner"]),
        )
        self.state = "starting"
        self.detail = ""
        self.learner_restarts = 0
        self.actors: dict[str, ray.actor.ActorHandle] = {}
        self.pgs: dict[str, object] = {}
        self.bundle_of: dict[str, tuple[str, int]] = {}
        self.last_info: dict[str, dict] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()

    # ---- placement -------------------------------------------------------------------------

    def _event(self, event: str, **fields) -> None:
        append_event(self.launch["events"], role="supervisor", event=event, **fields)

    def _make_pg(self, what: str, slots: list[Slot], strategy: str) -> None:
        pg = placement_group(
            [dict(s.bundle) or {"CPU": 0.001} for s in slots],
            strategy=strategy,
            name=pg_name(self.namespace, self.run_id, what),
            lifetime="detached",
            bundle_label_selector=[{LABEL_NODE_ID: s.node_id} for s in slots],
        )
        self.pgs[what] = pg
        for i, slot in enumerate(slots):
            self.bundle_of[slot.name] = (what, i)

    def _options(self, slot: Slot, *, max_restarts: int) -> dict:
        bundle = dict(slot.bundle)
        gpu = self.launch["gpu_resource"]
        options = {
            "name": actor_name(self.run_id, slot.name),
            "namespace": self.namespace,
            "lifetime": "detached",
            "max_restarts": max_restarts,
            "max_concurrency": 4,  # info() answers while stop() waits
            "num_cpus": bundle.pop("CPU", 0),
        }
        gpus = bundle.pop(gpu, 0)
        if gpu == "GPU":
            options["num_gpus"] = gpus
        elif gpus:
            bundle[gpu] = gpus
        if bundle:
            options["resources"] = bundle
        if slot.name in self.bundle_of:
            what, index = self.bundle_of[slot.name]
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.pgs[what], placement_group_bundle_index=index
            )
        else:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                slot.node_id, soft=False
            )
        return options

    def _spec(self, slot: Slot, *, autostart: bool = True, restart_on_crash: bool = True) -> dict:
        return {
            "name": slot.name,
            "run_id": self.run_id,
            "argv": self.launch["argv"][slot.name],
            "env": self.launch.get("env", {}),
            "cwd": self.launch["cwd"],
            "log": str(Path(self.launch["log_dir"]) / f"{slot.name}.log"),
            "events": self.launch["events"],
            "autostart": autostart,
            "restart_on_crash": restart_on_crash,
        }

    def _role(self, slot: Slot, **spec) -> ray.actor.ActorHandle:
        restart = spec.get("restart_on_crash", True)
        max_restarts = self.launch["max_restarts"] if restart else 0
        remote = ray.remote(RoleProcess).options(**self._options(slot, max_restarts=max_restarts))
        handle = remote.remote(self._spec(slot, **spec))
        self.actors[slot.name] = handle
        return handle

    def start(self) -> dict:
        """Placement groups, then nats-server, the env servers, the learner and the actors."""
        try:
            with self._lock:
                plan = self.plan
                self._make_pg("envservers", list(plan.envservers), "SPREAD")
                for g, group in enumerate(plan.learner_groups()):
                    self._make_pg(f"learner-{g}", group, "STRICT_PACK")
                self._make_pg("actors", list(plan.actors), "SPREAD")
                timeout = self.launch["placement_timeout_s"]
                ready = [pg.ready() for pg in self.pgs.values()]
                done, pending = ray.wait(ready, num_returns=len(ready), timeout=timeout)
                if pending:
                    raise RuntimeError(
                        f"placement groups not placed within {timeout:.0f}s: the planned nodes "
                        "lack the resources now (another job holds them?) or are gone"
                    )
                ray.get(done)
                self._event("placed", groups=sorted(self.pgs))
                nats = self._role(plan.nats)
                ray.get(nats.info.remote(), timeout=120)
                self._wait_port(plan.nats.ip, self.launch["nats_port"], 60)
                for slot in plan.envservers:
                    self._role(slot)
                self._start_learner()
                for slot in plan.actors:
                    self._role(slot)
                ray.get([a.info.remote() for a in self.actors.values()], timeout=300)
                self.state = "running"
                self._event("running")
                return self.status()
        except Exception as e:
            self.state = "failed"
            self.detail = f"start: {e}"
            self._event("failed", detail=self.detail)
            raise

    def _wait_port(self, host: str, port: int, timeout_s: float) -> None:
        import socket

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with socket.socket() as s:
                s.settimeout(1)
                if s.connect_ex((host, port)) == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"nats-server did not listen on {host}:{port} in {timeout_s:.0f}s")

    def _start_learner(self) -> None:
        ranks = {
            slot.name: self._role(slot, autostart=False, restart_on_crash=False)
            for slot in self.plan.learner
        }
        placements = ray.get([r.placement.remote() for r in ranks.values()], timeout=300)
        gpu_ids = {name: p["gpu_ids"] for name, p in zip(ranks, placements, strict=True)}
        env = learner_env(self.plan, self.launch["ports"], gpu_ids)
        ray.get([r.start.remote(env[name]) for name, r in ranks.items()], timeout=120)

    # ---- watching ------------------------------------------------------------------------

    def supervise(self, poll_s: float = 1.0) -> str:
        """Until the learner finishes (then stop every process), fails beyond its restarts,
        or stop() is called. Returns the final state."""
        while not self._stop.wait(poll_s):
            with self._lock:
                if self.state != "running":
                    break
                self._poll_others()
                verdict = self._poll_learner()
                if verdict == "finished":
                    self.state = "finishing"
                    self._event("learner finished")
                    self._stop_roles()
                    self.state = "finished"
                    self._event("finished")
                elif verdict == "failed":
                    if self.learner_restarts < self.launch["learner_max_restarts"]:
                        self.learner_restarts += 1
                        self._event("learner restart", attempt=self.learner_restarts)
                        self._restart_learner()
                    else:
                        self.detail = (
                            f"the learner failed {self.learner_restarts + 1} times "
                            f"(ray.learner_max_restarts = {self.launch['learner_max_restarts']})"
                        )
                        self.state = "failing"
                        self._event("failed", detail=self.detail)
                        self._stop_roles()
                        self.state = "failed"
        return self.state

    def _poll_learner(self) -> str | None:
        names = [s.name for s in self.plan.learner]
        refs = [self.actors[n].info.remote() for n in names]
        codes = []
        for name, ref in zip(names, refs, strict=True):
            try:
                info = ray.get(ref, timeout=30)
            except Exception as e:  # the rank's actor or node died
                self._event("learner rank lost", rank=name, error=type(e).__name__)
                return "failed"
            self.last_info[name] = info
            codes.append(info["returncode"])
        if all(code == 0 for code in codes):
            return "finished"
        if any(code not in (None, 0) for code in codes):
            return "failed"
        return None

    def _poll_others(self) -> None:
        slots = [self.plan.nats, *self.plan.envservers, *self.plan.actors]
        refs = {s.name: self.actors[s.name].info.remote() for s in slots}
        for name, ref in refs.items():
            try:
                self.last_info[name] = ray.get(ref, timeout=10)
            except ray.exceptions.ActorDiedError as e:
                if "restart" not in str(e).lower():
                    self.last_info[name] = {"name": name, "dead": True}
            except Exception:  # restarting (ActorUnavailableError), or slow: next poll
                pass

    def _restart_learner(self) -> None:
        names = [s.name for s in self.plan.learner]
        self._stop_and_kill(names, grace_s=30)
        self._start_learner()

    def _stop_and_kill(self, names: list[str], grace_s: float) -> None:
        handles = [self.actors[n] for n in names if n in self.actors]
        refs = [h.stop.remote(grace_s) for h in handles]
        for ref in refs:
            try:
                ray.get(ref, timeout=grace_s + 30)
            except Exception:
                pass  # already dead: nothing of it runs
        for name in names:
            handle = self.actors.pop(name, None)
            if handle is not None:
                ray.kill(handle, no_restart=True)
        # The names are free once Ray has the actors dead (a restart reuses them).
        deadline = time.monotonic() + 60
        for name in names:
            while time.monotonic() < deadline:
                try:
                    ray.get_actor(actor_name(self.run_id, name), namespace=self.namespace)
                except ValueError:
                    break
                time.sleep(0.2)

    def _stop_roles(self) -> None:
        """Every process of the run, in order: actors, learner, env servers, nats-server;
        then the placement groups."""
        plan = self.plan
        self._stop_and_kill([s.name for s in plan.actors], grace_s=40)
        self._stop_and_kill([s.name for s in plan.learner], grace_s=30)
        self._stop_and_kill([s.name for s in plan.envservers], grace_s=15)
        self._stop_and_kill([plan.nats.name], grace_s=15)
        for pg in self.pgs.values():
            try:
                remove_placement_group(pg)
            except Exception:
                pass
        self.pgs.clear()
        self._event("stopped")

    def stop(self) -> dict:
        """Stop every process of the run (`make cluster-down`)."""
        self._stop.set()
        with self._lock:
            if self.state not in ("stopped", "finished", "failed"):
                self.state = "stopping"
                self._stop_roles()
                self.state = "stopped"
            elif self.actors or self.pgs:
                self._stop_roles()
        return self.status()

    def status(self) -> dict:
        return {
            "run_id": self.run_id,
            "state": self.state,
            "detail": self.detail,
            "learner_restarts": self.learner_restarts,
            "processes": dict(self.last_info),
            "actors": sorted(self.actors),
        }
