"""The Ray driver's calls into the cluster: connecting (RAY_ADDRESS, else `ray start`'s local
cluster) with this checkout on every node's PYTHONPATH, the live nodes, free ports asked of
each node, and starting the run's supervisor, a named, detached actor on the head node
(deploy/ray_supervisor.py). Ray is imported inside each call, so the CLI can say that Ray is
missing before anything of it loads.
"""

from __future__ import annotations

import os
from pathlib import Path

from deploy.config import RunConfig
from deploy.ray_commands import fixed_ports, port_bases, ports_from_pools, ports_per_host
from deploy.ray_plan import Node, Plan
from deploy.ray_records import Prepared, launch_spec

REPO_ROOT = Path(__file__).resolve().parent.parent


class NoCluster(RuntimeError):
    """The Ray cluster cannot be reached."""


def connect(namespace: str):
    import ray

    address = os.environ.get("RAY_ADDRESS") or "auto"
    try:
        return _init(ray, address, namespace)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise NoCluster(
            f"no Ray cluster at {address} ({e}); start one (`ray start --head`, docs/deploy.md) "
            "and set RAY_ADDRESS=HEAD_IP:6379"
        ) from None


def _init(ray, address: str, namespace: str):
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    ray.init(
        address=address,
        namespace=namespace,
        # This checkout on every node (the same path): the role actors import deploy/.
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
        logging_level="WARNING",
        log_to_driver=False,
    )
    return ray


def alive_nodes(ray) -> list[Node]:
    return [Node.from_ray(n) for n in ray.nodes() if n["Alive"]]


def run_ports(ray, plan: Plan, run: RunConfig) -> dict[str, dict[str, int]]:
    """Every process's ports: the fixed ones, or (`ray.free_ports`) free ones from each node."""
    if not run.ray.free_ports:
        return fixed_ports(plan, port_bases(run))
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from deploy.ray_process import free_ports_on_node

    by_ip = {slot.ip: slot.node_id for slot in plan.slots}
    pools = {}
    for host, count in ports_per_host(plan).items():
        task = free_ports_on_node.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(by_ip[host], soft=False)
        )
        pools[host] = ray.get(task.remote(count), timeout=60)
    return ports_from_pools(plan, pools)


def start_supervisor(ray, prepared: Prepared):
    """The run's supervisor, a named, detached actor on the head node, started: every
    process of the run placed. RayError when it could not."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from deploy.ray_supervisor import RunSupervisor

    run_id, run = prepared.run_dir.name, prepared.run
    supervisor = (
        ray.remote(RunSupervisor)
        .options(
            name=f"{run_id}/supervisor",
            namespace=run.ray.namespace,
            lifetime="detached",
            max_restarts=0,
            max_concurrency=8,
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(
                prepared.plan.nats.node_id, soft=False
            ),
        )
        .remote(launch_spec(prepared, environ=os.environ, cwd=REPO_ROOT))
    )
    ray.get(supervisor.start.remote(), timeout=run.ray.placement_timeout_s + 600)
    supervisor.supervise.remote()
    return supervisor
