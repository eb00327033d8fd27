"""The run supervisor's side of an elastic actor fleet on Ray (`RunSupervisor` mixes it
in; deploy/ray_fleet.py has the pure parts, common/fleet.py the rule).

    _size_fleet       every poll: end the leaves that are done; when a reading is due, the
                      backlog from the learner's /metrics, the size it asks for, and the
                      replicas started (`_add_replica`) or let go (`_leave`)
    _add_replica      a placement group of one actor bundle wherever Ray finds room; the
                      replica starts once it is placed (the supervisor's `_watch`), its
                      command made then (`_start_elastic_replica`: its node and a free port)
    _leave            SIGTERM with the drain grace: the replica hands its episodes back at
                      their next turn and exits; then its actor and bundle are released
    _request_resources  the fleet's bundles, told to Ray's autoscaler

A replica of the fleet is a role like any other while it runs: restarted with the same
budget (`[restarts]`) when it dies, its events in the run's events.jsonl.
"""

from __future__ import annotations

import ray
from ray.exceptions import RayError
from ray.util.placement_group import remove_placement_group

from common.supervision import Supervised
from deploy.ray_commands import actor_own
from deploy.ray_fleet import FleetWatch, changes, is_replica, read_work, replica_index
from deploy.ray_plan import Slot


class ElasticFleet:
    """Mixed into RunSupervisor: uses its roles, actors, placement groups and events."""

    def _init_fleet(self, spec: dict | None, replicas: int) -> None:
        self.fleet = None if spec is None else FleetWatch(spec, replicas)
        self.placing: dict[str, ray.ObjectRef] = {}  # replicas waiting for a node
        self.leaving: dict[str, ray.ObjectRef] = {}  # replicas handing their work back

    def _placed(self, role: str, now: float) -> bool:
        """False while the role is an elastic replica whose bundle waits for a node; once
        placed, it is due to start now (with a restart's error handling)."""
        if role not in self.placing:
            return True
        ready, _ = ray.wait([self.placing[role]], timeout=0)
        if not ready:
            return False
        del self.placing[role]
        self.events.write(role, "placed")
        self.restart_at[role] = now
        return True

    def _end_fleet(self) -> None:
        """After every process stopped: nothing placing or leaving, nothing asked of the
        autoscaler any more."""
        self.placing.clear()
        self.leaving.clear()
        if self.fleet is not None:
            self._request_resources(0)

    def _fleet_status(self) -> dict:
        return {
            "replicas": sorted(r for r in self.roles if is_replica(r)),
            "leaving": sorted(self.leaving),
        }

    def _start_elastic_replica(self, handle) -> None:
        """An elastic replica's command, once Ray placed it: its node's address and a port
        free there; the rest is every replica's (`fleet.actor_head`)."""
        fleet = self.launch["fleet"]
        ip = ray.get(handle.placement.remote(), timeout=300)["ip"]
        port = ray.get(handle.free_port.remote(), timeout=60)
        argv = fleet["actor_head"] + actor_own(ip, port, fleet["bind_host"], fleet["bundle"])
        ray.get(handle.start.remote({}, argv), timeout=120)

    def _size_fleet(self, now: float) -> None:
        """Read the backlog when due; start or let go replicas to the size it asks for; end
        the leaves that are done."""
        if self.fleet is None:
            return
        self._end_leaves()
        if not self.fleet.due(now):
            return
        work = read_work(self.launch["fleet"]["work_url"])
        if work is None:
            return  # the learner is not answering yet (or restarting): keep the fleet
        members = [role for role in self.roles if is_replica(role)]
        wanted = self.fleet.wanted(now, work)
        new, gone = changes(wanted, members)
        if not new and not gone:
            return
        self._event("scaled", replicas=wanted, was=len(members), work=work)
        for role in new:
            self._add_replica(role)
        for role in gone:
            self._leave(role)
        self._request_resources(wanted)

    def _add_replica(self, role: str) -> None:
        """A placement group of one actor bundle wherever Ray finds room; the replica starts
        once it is placed (`_watch`)."""
        bundle = self.launch["fleet"]["bundle"]
        slot = Slot(role, "actor", replica_index(role), node_id="", ip="", bundle=bundle)
        self._make_pg(role, [slot], "PACK")
        self.roles[role] = (slot,)
        self.supervised[role] = Supervised(self.policy)
        self.placing[role] = self.pgs[role].ready()

    def _leave(self, role: str) -> None:
        """SIGTERM: the replica stops each episode at its next turn boundary, checkpoints it
        and hands its group back, within its grace; it is no longer watched or restarted."""
        slot = self.roles.pop(role)[0]
        self.supervised.pop(role)
        self.restart_at.pop(role, None)
        if self.placing.pop(role, None) is not None or slot.name not in self.actors:
            self._release_bundle(role)  # never started: nothing to hand back
            self.events.write(role, "left", placed=False)
            return
        grace_s = self.launch["fleet"]["leave_grace_s"]
        self.leaving[role] = self.actors[role].stop.remote(grace_s)
        self.events.write(role, "leaving", pid=self.last_info.get(role, {}).get("pid"))

    def _end_leaves(self) -> None:
        for role, ref in list(self.leaving.items()):
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                continue
            del self.leaving[role]
            try:
                code = ray.get(ref)
            except RayError:
                code = None  # its actor or node went while it left
            handle = self.actors.pop(role, None)
            if handle is not None:
                ray.kill(handle, no_restart=True)
            self._release_bundle(role)
            self.events.write(role, "left", code=code)

    def _release_bundle(self, role: str) -> None:
        pg = self.pgs.pop(role, None)
        self.bundle_of.pop(role, None)
        if pg is not None:
            remove_placement_group(pg)

    def _request_resources(self, replicas: int) -> None:
        """Tell Ray's autoscaler the fleet's bundles (a hint; each call replaces the last):
        an autoscaling cluster adds nodes for them, and may release nodes once they shrink."""
        from ray.autoscaler.sdk import request_resources

        bundles = [dict(self.launch["fleet"]["bundle"])] * replicas
        try:
            request_resources(bundles=bundles)
        except Exception as e:  # a hint only: the fleet works on a fixed cluster too
            self._event("autoscaler request failed", error=f"{type(e).__name__}: {e}")
