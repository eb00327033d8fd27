"""Finding and stopping a Tether run on a Ray cluster (`make cluster-down TARGET=ray`), by
the names the run's actors and placement groups carry in the cluster itself: actors
`<run id>/<process>` and placement groups `<namespace>/<run id>/<group>` in the run's
namespace. The supervisor is asked first to stop every process (each RoleProcess stops its
own process tree on its own node); what it did not stop, because it was gone or stuck, is
stopped actor by actor; then every actor is killed, every placement group removed, and the
cluster is asked again that none is left.
"""

from __future__ import annotations

import json
import sys
import time

from ray.exceptions import RayError

from deploy.ray_records import actor_name, pg_name


def _say(text: str = "") -> None:
    print(text, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_actors(ray, namespace: str, run_id: str | None = None) -> dict[str, list[str]]:
    """Run id -> names of its named actors in the cluster (every run of the namespace, or one)."""
    runs: dict[str, list[str]] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] != namespace or "/" not in entry["name"]:
            continue
        rid = entry["name"].split("/", 1)[0]
        if run_id is None or rid == run_id:
            runs.setdefault(rid, []).append(entry["name"])
    return runs


def run_placement_groups(ray, namespace: str, run_id: str) -> dict[str, str]:
    """Placement group id -> name, for the run's groups not yet removed."""
    from ray.util.placement_group import placement_group_table

    prefix = pg_name(namespace, run_id, "")
    return {
        pg_id: info["name"]
        for pg_id, info in placement_group_table().items()
        if info.get("name", "").startswith(prefix) and info.get("state") != "REMOVED"
    }


def _down_run(ray, namespace: str, run_id: str) -> bool:
    """Stop one run: every process, actor and placement group. True when none is left."""
    from ray.util.placement_group import PlacementGroup

    names = run_actors(ray, namespace, run_id).get(run_id, [])
    supervisor_name = actor_name(run_id, "supervisor")
    if supervisor_name in names:
        try:
            handle = ray.get_actor(supervisor_name, namespace=namespace)
            ray.get(handle.stop.remote(), timeout=300)
        except (RayError, ValueError) as e:  # dead, gone or stuck: the actors by name, below
            _say(f"  supervisor of {run_id} did not stop the run ({type(e).__name__}): by name")
    # What the supervisor did not (it was gone, or a call timed out): every actor by name,
    # its process tree stopped by its own actor on its own node, then the actor killed.
    for name in run_actors(ray, namespace, run_id).get(run_id, []):
        try:
            handle = ray.get_actor(name, namespace=namespace)
        except ValueError:
            continue
        if name != supervisor_name:
            try:
                ray.get(handle.stop.remote(15.0), timeout=60)
            except RayError:
                pass  # its actor is dead, and its process tree with it
        ray.kill(handle, no_restart=True)
    for pg_id in run_placement_groups(ray, namespace, run_id):
        ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = run_actors(ray, namespace, run_id).get(run_id, [])
        groups = run_placement_groups(ray, namespace, run_id)
        if not left and not groups:
            return True
        time.sleep(0.5)
    _err(f"  left in the cluster: actors {left}, placement groups {list(groups.values())}")
    return False


def down(ray, run_id: str | None, namespace: str) -> int:
    """`make cluster-down TARGET=ray`: every run of the namespace (or one) stopped."""
    runs = run_actors(ray, namespace, run_id)
    if not runs:
        _say(f"no Tether run on this Ray cluster (namespace {namespace})")
        return 0
    ok = True
    for rid in sorted(runs):
        _say(f"stopping run {rid} ({len(runs[rid])} actors) ...")
        ok &= _down_run(ray, namespace, rid)
        _say(f"run {rid}: {'stopped; nothing left' if ok else 'NOT fully stopped'}")
    return 0 if ok else 1


def status(ray, namespace: str) -> int:
    """Each run's state as its supervisor sees it."""
    runs = run_actors(ray, namespace)
    if not runs:
        _say(f"no Tether run on this Ray cluster (namespace {namespace})")
    for rid in sorted(runs):
        try:
            handle = ray.get_actor(actor_name(rid, "supervisor"), namespace=namespace)
            info = ray.get(handle.status.remote(), timeout=30)
            _say(json.dumps(info, indent=2))
        except (RayError, ValueError) as e:  # no supervisor: say what is there
            _say(f"{rid}: no supervisor ({type(e).__name__}); actors {runs[rid]}")
    return 0
