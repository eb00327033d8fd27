"""A real Ray cluster of simulated nodes on this machine, every process bound to 127.0.0.1:
to try `make cluster-up TARGET=ray` without a cluster, and what the Ray tests and
bench/elastic.py run on. Each node is a raylet of its own with its own resources (custom
ones, such as `gpu_node`, stand in for GPUs, with `ray.gpu_resource`).

    with local_cluster([HEAD, GPU_NODE, GPU_NODE]) as cluster:   # RAY_ADDRESS set inside
        subprocess.run([sys.executable, "-m", "deploy.cluster", "up", "--target=ray", ...])
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence

NODE = {
    "num_cpus": 2,
    "object_store_memory": 200 * 1024 * 1024,
    "node_ip_address": "127.0.0.1",
}
HEAD = {**NODE, "include_dashboard": False, "resources": {"cpu_node": 1}}
"""The head: nats-server, the env servers and the run's supervisor."""
GPU_NODE = {**NODE, "resources": {"gpu_node": 2}}
"""A node whose `gpu_node` units stand in for GPUs: the learner's and the actors'."""
FITS_THE_TESTBED = [
    "ray.gpu_resource=gpu_node",
    "ray.cpus_per_learner_rank=1",
    "ray.cpus_per_actor=1",
    "ray.cpus_per_envserver=1",
    "ray.cpus_nats=0.5",
    "ray.free_ports=true",
]
"""A run's `[ray]` overrides for these nodes: small reservations, `gpu_node` as the GPUs,
free loopback ports."""


def start_cluster(nodes: Sequence[dict], attempts: int = 3):
    """The nodes, the first the head; again when a raylet misses Ray's fixed 30 s start-up
    window (a busy machine)."""
    from ray.cluster_utils import Cluster

    for attempt in range(1, attempts + 1):
        cluster = Cluster()
        try:
            for node in nodes:
                cluster.add_node(**node)
            cluster.wait_for_nodes()
            return cluster
        except Exception as e:  # Ray raises a bare Exception for a raylet that started late
            cluster.shutdown()
            if attempt == attempts:
                raise
            print(f"Ray cluster start-up failed ({e}); again", flush=True)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def local_cluster(nodes: Sequence[dict] = (HEAD, GPU_NODE)) -> Iterator:
    """The cluster, with RAY_ADDRESS pointing at it for the drivers started inside; shut
    down after, the environment as it was."""
    import ray

    # Ray resolves 127.0.0.1 to the machine's address for drivers unless told it is alone:
    # this keeps every Ray process and every connection on loopback.
    saved = {k: os.environ.get(k) for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # the driver processes started
    constants = ray._private.ray_constants  # this process read the variable at import
    enabled, constants.ENABLE_RAY_CLUSTER = constants.ENABLE_RAY_CLUSTER, False
    started = time.monotonic()
    cluster = start_cluster(nodes)
    os.environ["RAY_ADDRESS"] = cluster.address
    print(
        f"Ray cluster of {len(nodes)} nodes up in {time.monotonic() - started:.1f}s "
        f"at {cluster.address}",
        flush=True,
    )
    try:
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        constants.ENABLE_RAY_CLUSTER = enabled
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
