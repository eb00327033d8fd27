"""Where a Tether run's processes go on a Ray cluster. Pure: the nodes (their resources, as
`ray.nodes()` reports them) and the `[ray]` section in, an assignment out; no Ray import.

    nats-server       the head node
    env servers       CPU nodes (nodes without the GPU resource); GPU nodes' spare CPUs only
                      when no CPU node has room
    learner ranks     GPU nodes: `learner.nproc` ranks split evenly over `ray.learner_nodes`
                      nodes, each node's ranks one STRICT_PACK placement group (NCCL inside a
                      node stays on NVLink)
    actor replicas    GPU nodes: one `actor --replicas 1` process per replica, spread over
                      the GPU nodes with the most free GPUs

The Ray driver (deploy/ray_cluster.py) turns the plan into placement groups whose bundles
are pinned to the planned nodes (the `ray.io/node-id` label), so the processes land where
the plan says and a process Ray restarts comes back on the same node, at the same address.
What each process runs, and on which ports, is deploy/ray_commands.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deploy.config import RayRunConfig, RunConfig

HEAD_RESOURCE = "node:__internal_head__"
"""Ray gives the head node this resource (and no other node)."""


class PlanError(ValueError):
    """The cluster cannot hold the run as asked; the message says what is missing."""


@dataclass(frozen=True)
class Node:
    """One alive Ray node: its id, its IP and its total resources."""

    node_id: str
    ip: str
    resources: Mapping[str, float]
    is_head: bool = False

    @classmethod
    def from_ray(cls, info: Mapping) -> Node:
        """From one entry of `ray.nodes()`."""
        resources = dict(info["Resources"])
        return cls(
            node_id=info["NodeID"],
            ip=info["NodeManagerAddress"],
            resources=resources,
            is_head=HEAD_RESOURCE in resources,
        )

    def label(self) -> str:
        return f"{self.ip} ({self.node_id[:8]}{', head' if self.is_head else ''})"


def gpus_per_actor(run: RunConfig) -> float:
    """GPUs one actor replica reserves: `ray.gpus_per_actor`, else its engine's tensor
    parallel size."""
    if run.ray.gpus_per_actor is not None:
        return run.ray.gpus_per_actor
    return float(run.actor.engine.tensor_parallel_size)


def bundle(ray: RayRunConfig, role: str, actor_gpus: float) -> dict[str, float]:
    """The resources one process of `role` reserves (zero amounts left out)."""
    gpus, cpus = {
        "nats": (0.0, ray.cpus_nats),
        "envserver": (0.0, ray.cpus_per_envserver),
        "actor": (actor_gpus, ray.cpus_per_actor),
        "learner": (ray.gpus_per_learner_rank, ray.cpus_per_learner_rank),
    }[role]
    amounts = {"CPU": cpus, ray.gpu_resource: gpus}
    return {name: amount for name, amount in amounts.items() if amount > 0}


@dataclass(frozen=True)
class Slot:
    """One process of the run and the node it runs on."""

    name: str
    """Unique in the run: nats, envserver-<i>, actor-<i>, learner-<rank>."""
    role: str
    """nats, envserver, actor or learner."""
    index: int
    """The process's number within its role (the rank, for the learner)."""
    node_id: str
    ip: str
    bundle: dict[str, float] = field(default_factory=dict)
    """Resources reserved for it (its placement group bundle)."""
    group: int = 0
    """Learner: which learner node (placement group) the rank is in."""
    local_rank: int = 0
    """Learner: the rank's number within its node."""


@dataclass(frozen=True)
class Plan:
    nats: Slot
    envservers: tuple[Slot, ...]
    actors: tuple[Slot, ...]
    learner: tuple[Slot, ...]
    """Learner ranks, by rank."""
    notes: tuple[str, ...] = ()
    """Choices worth telling (a fallback taken)."""

    @property
    def slots(self) -> tuple[Slot, ...]:
        return (self.nats, *self.envservers, *self.learner, *self.actors)

    def learner_groups(self) -> list[list[Slot]]:
        """The learner's ranks, one list per learner node (placement group)."""
        groups: dict[int, list[Slot]] = defaultdict(list)
        for slot in self.learner:
            groups[slot.group].append(slot)
        return [groups[g] for g in sorted(groups)]

    def describe(self, nodes: Sequence[Node]) -> str:
        """One line per node: what runs there."""
        by_node: dict[str, list[str]] = defaultdict(list)
        for slot in self.slots:
            by_node[slot.node_id].append(slot.name)
        lines = []
        for node in nodes:
            if by_node.get(node.node_id):
                lines.append(f"  {node.label()}: {', '.join(by_node[node.node_id])}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "nats": vars(self.nats),
            "envservers": [vars(s) for s in self.envservers],
            "actors": [vars(s) for s in self.actors],
            "learner": [vars(s) for s in self.learner],
            "notes": list(self.notes),
        }


class _Free:
    """Resources still free on each node while the plan is made."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        self.left = {n.node_id: dict(n.resources) for n in nodes}

    def fits(self, node: Node, need: Mapping[str, float], times: int = 1) -> bool:
        left = self.left[node.node_id]
        return all(left.get(name, 0.0) + 1e-9 >= amount * times for name, amount in need.items())

    def take(self, node: Node, need: Mapping[str, float], times: int = 1) -> None:
        left = self.left[node.node_id]
        for name, amount in need.items():
            left[name] = left.get(name, 0.0) - amount * times

    def amount(self, node: Node, name: str) -> float:
        return self.left[node.node_id].get(name, 0.0)

    def most(self, candidates: list[Node], resource: str) -> Node:
        """The candidate with the most of `resource` left; ties: not the head, then the
        nodes' order."""
        order = {n.node_id: i for i, n in enumerate(self.nodes)}
        return max(
            candidates,
            key=lambda n: (self.amount(n, resource), not n.is_head, -order[n.node_id]),
        )


def _fmt(amount: float) -> str:
    return f"{amount:g}"


def plan_run(run: RunConfig, nodes: Sequence[Node]) -> Plan:
    """The plan of a validated run config on these nodes. An elastic fleet starts at its
    minimum; the run's supervisor adds replicas as the backlog asks (deploy/ray_fleet.py)."""
    ray = run.ray
    if run.elastic.enabled:
        ray = ray.model_copy(update={"actor_replicas": run.elastic.min_replicas})
    return make_plan(nodes, ray, learner_ranks=run.learner.nproc, actor_gpus=gpus_per_actor(run))


def make_plan(
    nodes: Sequence[Node], ray: RayRunConfig, *, learner_ranks: int, actor_gpus: float
) -> Plan:
    """Assign every process of the run to a node; PlanError says what does not fit."""
    heads = [n for n in nodes if n.is_head]
    if not heads:
        raise PlanError("no head node among the cluster's nodes (nats-server runs on the head)")
    if learner_ranks % ray.learner_nodes:
        raise PlanError(
            f"learner.nproc = {learner_ranks} ranks cannot be split evenly over "
            f"ray.learner_nodes = {ray.learner_nodes} nodes"
        )
    _check_gpus(nodes, ray, learner_ranks, actor_gpus)
    free = _Free(nodes)
    nats_bundle = bundle(ray, "nats", actor_gpus)
    head = heads[0]
    if not free.fits(head, nats_bundle):
        raise PlanError(f"the head node {head.label()} has no room for nats-server {nats_bundle}")
    free.take(head, nats_bundle)
    nats = Slot("nats", "nats", 0, head.node_id, head.ip, nats_bundle)
    learner = _place_learner(free, ray, learner_ranks, bundle(ray, "learner", actor_gpus))
    actors = _place_actors(free, ray, bundle(ray, "actor", actor_gpus))
    envservers, notes = _place_envservers(free, ray, bundle(ray, "envserver", actor_gpus))
    return Plan(nats, tuple(envservers), tuple(actors), tuple(learner), tuple(notes))


def _gpu_nodes(nodes: Sequence[Node], gpu: str) -> list[Node]:
    return [n for n in nodes if n.resources.get(gpu, 0) > 0]


def _check_gpus(nodes: Sequence[Node], ray: RayRunConfig, ranks: int, actor_gpus: float) -> None:
    """Enough GPUs in all, or a PlanError that counts them."""
    gpu = ray.gpu_resource
    gpu_nodes = _gpu_nodes(nodes, gpu)
    needed = ranks * ray.gpus_per_learner_rank + ray.actor_replicas * actor_gpus
    have = sum(n.resources[gpu] for n in gpu_nodes)
    if needed > have + 1e-9:
        listed = ", ".join(f"{n.label()} {_fmt(n.resources[gpu])}" for n in gpu_nodes) or "none"
        raise PlanError(
            f"too few GPUs: the run needs {_fmt(needed)} {gpu} "
            f"(learner {ranks} ranks x {_fmt(ray.gpus_per_learner_rank)}, "
            f"actors {ray.actor_replicas} replicas x {_fmt(actor_gpus)}) but the "
            f"cluster has {_fmt(have)} (GPU nodes: {listed}). Add GPU nodes (`ray start "
            f"--num-gpus`), or lower ray.actor_replicas or learner.nproc."
        )


def _place_learner(
    free: _Free, ray: RayRunConfig, ranks: int, rank_bundle: dict[str, float]
) -> list[Slot]:
    """Each learner node's ranks together on the GPU node with the most free GPUs."""
    gpu = ray.gpu_resource
    per_node = ranks // ray.learner_nodes
    gpu_nodes = _gpu_nodes(free.nodes, gpu)
    learner: list[Slot] = []
    for group in range(ray.learner_nodes):
        fitting = [n for n in gpu_nodes if free.fits(n, rank_bundle, per_node)]
        if not fitting:
            free_now = ", ".join(
                f"{n.label()} {_fmt(free.amount(n, gpu))} {gpu}, {_fmt(free.amount(n, 'CPU'))} CPU"
                for n in gpu_nodes
            )
            raise PlanError(
                f"no GPU node can hold learner node {group}: its {per_node} ranks are packed "
                f"on one node (STRICT_PACK) and need {_fmt(per_node * rank_bundle.get(gpu, 0))} "
                f"{gpu} and {_fmt(per_node * rank_bundle.get('CPU', 0))} CPU there; free: "
                f"{free_now or 'no GPU nodes'}"
            )
        node = free.most(fitting, gpu)
        free.take(node, rank_bundle, per_node)
        for local in range(per_node):
            rank = group * per_node + local
            learner.append(
                Slot(
                    f"learner-{rank}",
                    "learner",
                    rank,
                    node.node_id,
                    node.ip,
                    rank_bundle,
                    group=group,
                    local_rank=local,
                )
            )
    return learner


def _place_actors(free: _Free, ray: RayRunConfig, actor_bundle: dict[str, float]) -> list[Slot]:
    """Each replica on the GPU node with the most free GPUs (spread)."""
    gpu_nodes = _gpu_nodes(free.nodes, ray.gpu_resource)
    actors: list[Slot] = []
    for index in range(ray.actor_replicas):
        fitting = [n for n in gpu_nodes if free.fits(n, actor_bundle)]
        if not fitting:
            raise PlanError(
                f"no GPU node has room for actor replica {index} ({actor_bundle}) after the "
                f"learner and {index} replicas: lower ray.actor_replicas, ray.cpus_per_actor "
                f"or ray.gpus_per_actor, or add GPU nodes"
            )
        node = free.most(fitting, ray.gpu_resource)
        free.take(node, actor_bundle)
        actors.append(Slot(f"actor-{index}", "actor", index, node.node_id, node.ip, actor_bundle))
    return actors


def _place_envservers(
    free: _Free, ray: RayRunConfig, env_bundle: dict[str, float]
) -> tuple[list[Slot], list[str]]:
    """Each env server on the CPU node with the most free CPUs; GPU nodes only when no CPU
    node has room (and a note says so)."""
    gpu = ray.gpu_resource
    cpu_nodes = [n for n in free.nodes if n.resources.get(gpu, 0) <= 0]
    gpu_nodes = _gpu_nodes(free.nodes, gpu)
    envservers: list[Slot] = []
    notes: list[str] = []
    for index in range(ray.envservers):
        fitting = [n for n in cpu_nodes if free.fits(n, env_bundle)]
        if not fitting:
            fitting = [n for n in gpu_nodes if free.fits(n, env_bundle)]
            if fitting and not notes:
                notes.append(
                    f"no CPU node (a node without {gpu}) has room for env servers: "
                    "they use spare CPUs of GPU nodes"
                )
        if not fitting:
            raise PlanError(
                f"no node has room for env server {index} ({env_bundle}): lower "
                f"ray.envservers or ray.cpus_per_envserver, or add CPU nodes"
            )
        node = free.most(fitting, "CPU")
        free.take(node, env_bundle)
        envservers.append(
            Slot(f"envserver-{index}", "envserver", index, node.node_id, node.ip, env_bundle)
        )
    return envservers, notes
