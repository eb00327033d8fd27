"""The run's supervisor on a Ray cluster: a named, detached Ray actor on the head node
(`<run>/supervisor`) that places the run and watches it.

    start()      placement groups (bundles pinned to the planned nodes), then one
                 RoleProcess actor per process: nats-server, env servers, learner ranks,
                 actor replicas
    supervise()  until the learner exits 0 (then stop every process) or fails beyond
                 ray.learner_max_restarts: a failed learner rank restarts all ranks
    stop()       every process, actors first; the placement groups (`make cluster-down`)
    status()     the run's state and each process's PID, node and return code

Ray restarts nats-server, env servers and actor replicas itself (deploy/ray_process.py); the
learner's ranks share one torch.distributed group, so one rank alone cannot come back: the
supervisor stops every rank and starts them all again, as torchrun's agent does, and they
resume from the newest checkpoint (`learner.checkpoint.resume`).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import ray
from ray.exceptions import RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from deploy.ray_commands import learner_env
from deploy.ray_plan import Plan, Slot
from deploy.ray_process import RoleProcess, append_event
from deploy.ray_records import actor_name, pg_name

LABEL_NODE_ID = "ray.io/node-id"
"""Ray's label of every node with its id: bundles are pinned to the planned nodes by it."""


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
        except (RayError, RuntimeError) as e:  # tell the driver why, then fail the call
            self.state = "failed"
            self.detail = f"start: {e}"
            self._event("failed", detail=self.detail)
            raise

    def _wait_port(self, host: str, port: int, timeout_s: float) -> None:
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
            except RayError as e:  # the rank's actor or node died, or it hangs
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
            except ray.exceptions.ActorDiedError:  # out of restarts (max_restarts)
                self.last_info[name] = {"name": name, "dead": True}
            except RayError:  # restarting (ActorUnavailableError) or slow: the next poll
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
            except RayError:
                pass  # its actor is dead, and its process tree with it
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
            remove_placement_group(pg)
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
