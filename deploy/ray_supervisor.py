"""The run's supervisor on a Ray cluster: a named, detached Ray actor on the head node
(`<run>/supervisor`) that places the run and watches it.

    start()      placement groups (bundles pinned to the planned nodes), then one
                 RoleProcess actor per process: nats-server, env servers, learner ranks,
                 actor replicas
    supervise()  every second: a role whose process exited (or whose Ray actor or node is
                 gone) is restarted in its bundle after the backoff, or the run fails once
                 it spent its budget; the learner's exit 0 ends the run (every process
                 stopped); with `[elastic]`, the actor replicas are sized by the prompts
                 backlog (deploy/ray_elastic.py)
    stop()       every process, actors first; the placement groups (`make cluster-down`)
    status()     the run's state and each process's PID, node and return code

The decisions and the events are common/supervision.py's, as for `make run`'s launcher and
the actor's own supervisor of its replicas: `[restarts]` sets them all, and Ray restarts
nothing itself. A role is one process (nats, envserver-<i>, actor-<i>) or the learner: its
ranks share one torch.distributed group, so one rank alone cannot come back; the supervisor
stops every rank and starts them all again, as torchrun's agent does, and they resume from
the newest checkpoint (`learner.checkpoint.resume`).
"""

from __future__ import annotations

import threading
import time
import traceback
from pathlib import Path

import ray
from ray.exceptions import RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from common.procs import wait_for_port
from common.supervision import Events, RestartPolicy, Supervised
from deploy.ray_commands import learner_env
from deploy.ray_elastic import ElasticFleet
from deploy.ray_fleet import is_replica
from deploy.ray_plan import Plan, Slot
from deploy.ray_process import RoleProcess
from deploy.ray_records import actor_name, pg_name

LEARNER = "learner"
"""The learner's role: all its ranks, restarted together."""

LABEL_NODE_ID = "ray.io/node-id"
"""Ray's label of every node with its id: bundles are pinned to the planned nodes by it."""


class RunSupervisor(ElasticFleet):
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
        self.events = Events(launch["events"])
        self.policy = RestartPolicy(**launch["restarts"])
        self.roles: dict[str, tuple[Slot, ...]] = {
            self.plan.nats.name: (self.plan.nats,),
            **{slot.name: (slot,) for slot in self.plan.envservers},
            LEARNER: self.plan.learner,
            **{slot.name: (slot,) for slot in self.plan.actors},
        }  # in start order
        self.supervised = {r: Supervised(self.policy, finishes=r == LEARNER) for r in self.roles}
        self._init_fleet(launch.get("fleet"), len(self.plan.actors))
        self.restart_at: dict[str, float] = {}
        self.actors: dict[str, ray.actor.ActorHandle] = {}
        self.pgs: dict[str, object] = {}
        self.bundle_of: dict[str, tuple[str, int]] = {}
        self.last_info: dict[str, dict] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()

    # ---- placement -------------------------------------------------------------------------

    def _event(self, event: str, **fields) -> None:
        self.events.write("run", event, **fields)

    def _make_pg(self, what: str, slots: list[Slot], strategy: str) -> None:
        pg = placement_group(
            [dict(s.bundle) or {"CPU": 0.001} for s in slots],
            strategy=strategy,
            name=pg_name(self.namespace, self.run_id, what),
            lifetime="detached",
            # Planned slots are pinned to their nodes; an elastic replica goes where Ray
            # (or its autoscaler) finds room.
            bundle_label_selector=[{LABEL_NODE_ID: s.node_id} for s in slots]
            if all(s.node_id for s in slots)
            else None,
        )
        self.pgs[what] = pg
        for i, slot in enumerate(slots):
            self.bundle_of[slot.name] = (what, i)

    def _options(self, slot: Slot) -> dict:
        bundle = dict(slot.bundle)
        gpu = self.launch["gpu_resource"]
        options = {
            "name": actor_name(self.run_id, slot.name),
            "namespace": self.namespace,
            "lifetime": "detached",
            "max_restarts": 0,  # this supervisor restarts roles: one budget, not two
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

    def _spec(self, slot: Slot, *, autostart: bool, restart: int) -> dict:
        return {
            "name": slot.name,
            "run_id": self.run_id,
            "argv": self.launch["argv"].get(slot.name, []),  # an elastic replica's: at start
            "env": self.launch.get("env", {}),
            "cwd": self.launch["cwd"],
            "log": str(Path(self.launch["log_dir"]) / f"{slot.name}.log"),
            "events": self.launch["events"],
            "autostart": autostart,
            "restart": restart,
        }

    def _start_role(self, role: str) -> None:
        """Start the role's processes (each a RoleProcess actor in its bundle) and record the
        start. The learner's ranks start together, once every rank knows its GPUs."""
        restart = self.supervised[role].started(time.monotonic())
        slots = self.roles[role]
        elastic = role != LEARNER and role not in self.launch["argv"]  # its command: once placed
        handles = {}
        for slot in slots:
            spec = self._spec(slot, autostart=role != LEARNER and not elastic, restart=restart)
            remote = ray.remote(RoleProcess).options(**self._options(slot))
            handles[slot.name] = self.actors[slot.name] = remote.remote(spec)
        if elastic:
            self._start_elastic_replica(handles[role])
        if role == LEARNER:
            placements = ray.get([h.placement.remote() for h in handles.values()], timeout=300)
            gpu_ids = {name: p["gpu_ids"] for name, p in zip(handles, placements, strict=True)}
            env = learner_env(self.plan, self.launch["ports"], gpu_ids)
            ray.get([h.start.remote(env[name]) for name, h in handles.items()], timeout=120)
        infos = ray.get([h.info.remote() for h in handles.values()], timeout=300)
        for info in infos:
            self.last_info[info["name"]] = info
        self.events.write(
            role, "started", pid=infos[0]["pid"], restart=restart, node=infos[0]["ip"]
        )

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
                self._start_role(plan.nats.name)
                wait_for_port(plan.nats.ip, self.launch["nats_port"], 60, "nats-server")
                for role in list(self.roles)[1:]:
                    self._start_role(role)
                self.state = "running"
                self._event("running")
                return self.status()
        except (RayError, RuntimeError) as e:  # tell the driver why, then fail the call
            self.state = "failed"
            self.detail = f"start: {e}"
            self._event("failed", detail=self.detail)
            raise

    # ---- watching ------------------------------------------------------------------------

    def supervise(self, poll_s: float = 1.0) -> str:
        """Until the learner finishes (then stop every process), a role spends its restart
        budget, or stop() is called. Returns the final state."""
        while not self._stop.wait(poll_s):
            with self._lock:
                if self.state != "running":
                    break
                try:
                    self._watch_all()
                except Exception as e:  # a fault of this code: end the run, never hang it
                    self.detail = f"the run's supervisor failed: {type(e).__name__}: {e}"
                    self._event("supervisor failed", traceback=traceback.format_exc())
                    self._end("failed")
        return self.state

    def _watch_all(self) -> None:
        for role in list(self.roles):
            self._watch(role, time.monotonic())
            if self.state != "running":
                return
        self._size_fleet(time.monotonic())

    def _watch(self, role: str, now: float) -> None:
        if not self._placed(role, now):
            return  # an elastic replica waiting for a node
        if role in self.restart_at:
            if now >= self.restart_at[role]:
                del self.restart_at[role]
                try:
                    self._start_role(role)
                except RayError as e:  # its bundle's node is gone, or Ray is overloaded
                    self._event("start failed", role=role, error=f"{type(e).__name__}: {e}")
                    self._on_exit(role, None, None, now)
            return
        exited = self._exit_of(role)
        if exited is not None:
            self._on_exit(role, *exited, now)

    def _on_exit(self, role: str, code: int | None, pid: int | None, now: float) -> None:
        self._stop_and_kill([slot.name for slot in self.roles[role]], grace_s=30)
        verdict = self.supervised[role].exited(code, now)
        if verdict.action == "finished":
            self.events.write(role, "finished", pid=pid, code=code)
            self._end("finished")
        elif verdict.action == "gave_up":
            self.events.write(role, "gave_up", pid=pid, code=code, reason=verdict.reason)
            self.detail = f"{role} exited with code {code}: {verdict.reason}"
            self._end("failed")
        else:
            self.restart_at[role] = verdict.restart_at
            self.events.write(
                role, "exited", pid=pid, code=code, restart_in_s=round(verdict.restart_at - now, 3)
            )

    def _exit_of(self, role: str) -> tuple[int | None, int | None] | None:
        """(exit code, pid) once the role's process ended: code None when it was lost with
        its Ray actor or node. For the learner: the first rank that failed, or code 0 once
        every rank finished. None while it runs."""
        names = [slot.name for slot in self.roles[role]]
        refs = [self.actors[name].info.remote() for name in names]
        codes = []
        for name, ref in zip(names, refs, strict=True):
            try:
                info = ray.get(ref, timeout=30)
            except ray.exceptions.GetTimeoutError:
                return None  # a slow answer on a busy node: ask again next time
            except RayError:  # its actor or its node is gone
                return None, self.last_info.get(name, {}).get("pid")
            self.last_info[name] = info
            code = info["returncode"]
            if code is not None and (code != 0 or role != LEARNER):
                return code, info["pid"]
            codes.append(code)
        if all(code == 0 for code in codes):
            return 0, self.last_info[names[0]]["pid"]
        return None

    def _end(self, state: str) -> None:
        self._event("stopping", outcome=state)
        self._stop_roles()
        self.state = state
        self._event(state, detail=self.detail)

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
        self._stop_and_kill(sorted(n for n in self.actors if is_replica(n)), grace_s=40)
        self._stop_and_kill([s.name for s in plan.learner], grace_s=30)
        self._stop_and_kill([s.name for s in plan.envservers], grace_s=15)
        self._stop_and_kill([plan.nats.name], grace_s=15)
        for pg in self.pgs.values():
            remove_placement_group(pg)
        self.pgs.clear()
        self._end_fleet()
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
            "restarts": {role: sup.num_restarts for role, sup in self.supervised.items()},
            "processes": dict(self.last_info),
            "actors": sorted(self.actors),
            **self._fleet_status(),
        }
