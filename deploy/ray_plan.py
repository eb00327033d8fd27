"""Where a Tether run's processes go on a Ray cluster, and what each of them runs. Pure: the
nodes (their resources, as `ray.nodes()` reports them) in, an assignment out; no Ray import.

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

Ports: the k-th process of a kind on one host gets the kind's base port + k (the bases are
the roles' own config values), so several simulated nodes on one host (tests) never clash.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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


@dataclass(frozen=True)
class Demand:
    """What the run asks of the cluster (from the `[ray]` section and the roles' sizes)."""

    learner_ranks: int = 1
    learner_nodes: int = 1
    actor_replicas: int = 1
    envservers: int = 1
    gpu_resource: str = "GPU"
    gpus_per_learner_rank: float = 1.0
    gpus_per_actor: float = 1.0
    cpus_per_learner_rank: float = 1.0
    cpus_per_actor: float = 1.0
    cpus_per_envserver: float = 1.0
    cpus_nats: float = 0.0

    @classmethod
    def from_config(cls, run) -> Demand:
        """From a validated `deploy.config.RunConfig`."""
        ray = run.ray
        gpus_per_actor = ray.gpus_per_actor
        if gpus_per_actor is None:
            gpus_per_actor = float(run.actor.engine.tensor_parallel_size)
        return cls(
            learner_ranks=run.learner.nproc,
            learner_nodes=ray.learner_nodes,
            actor_replicas=ray.actor_replicas,
            envservers=ray.envservers,
            gpu_resource=ray.gpu_resource,
            gpus_per_learner_rank=ray.gpus_per_learner_rank,
            gpus_per_actor=gpus_per_actor,
            cpus_per_learner_rank=ray.cpus_per_learner_rank,
            cpus_per_actor=ray.cpus_per_actor,
            cpus_per_envserver=ray.cpus_per_envserver,
            cpus_nats=ray.cpus_nats,
        )

    def bundle(self, role: str) -> dict[str, float]:
        """The resources one process of `role` reserves (zero amounts left out)."""
        gpus, cpus = {
            "nats": (0.0, self.cpus_nats),
            "envserver": (0.0, self.cpus_per_envserver),
            "actor": (self.gpus_per_actor, self.cpus_per_actor),
            "learner": (self.gpus_per_learner_rank, self.cpus_per_learner_rank),
        }[role]
        bundle = {"CPU": cpus, self.gpu_resource: gpus}
        return {name: amount for name, amount in bundle.items() if amount > 0}


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


def _fmt(amount: float) -> str:
    return f"{amount:g}"


def make_plan(nodes: Sequence[Node], demand: Demand) -> Plan:
    """Assign every process of the run to a node; PlanError says what does not fit."""
    alive = list(nodes)
    heads = [n for n in alive if n.is_head]
    if not heads:
        raise PlanError("no head node among the cluster's nodes (nats-server runs on the head)")
    head = heads[0]
    gpu = demand.gpu_resource
    gpu_nodes = [n for n in alive if n.resources.get(gpu, 0) > 0]
    cpu_nodes = [n for n in alive if n.resources.get(gpu, 0) <= 0]
    if demand.learner_ranks % demand.learner_nodes:
        raise PlanError(
            f"learner.nproc = {demand.learner_ranks} ranks cannot be split evenly over "
            f"ray.learner_nodes = {demand.learner_nodes} nodes"
        )
    per_node = demand.learner_ranks // demand.learner_nodes
    gpus_needed = (
        demand.learner_ranks * demand.gpus_per_learner_rank
        + demand.actor_replicas * demand.gpus_per_actor
    )
    gpus_have = sum(n.resources.get(gpu, 0) for n in gpu_nodes)
    if gpus_needed > gpus_have + 1e-9:
        have = ", ".join(f"{n.label()} {_fmt(n.resources[gpu])}" for n in gpu_nodes) or "none"
        raise PlanError(
            f"too few GPUs: the run needs {_fmt(gpus_needed)} {gpu} "
            f"(learner {demand.learner_ranks} ranks x {_fmt(demand.gpus_per_learner_rank)}, "
            f"actors {demand.actor_replicas} replicas x {_fmt(demand.gpus_per_actor)}) but the "
            f"cluster has {_fmt(gpus_have)} (GPU nodes: {have}). Add GPU nodes (`ray start "
            f"--num-gpus`), or lower ray.actor_replicas or learner.nproc."
        )
    free = _Free(alive)
    notes: list[str] = []

    nats_bundle = demand.bundle("nats")
    if not free.fits(head, nats_bundle):
        raise PlanError(f"the head node {head.label()} has no room for nats-server {nats_bundle}")
    free.take(head, nats_bundle)
    nats = Slot("nats", "nats", 0, head.node_id, head.ip, nats_bundle)

    def most_free(candidates: list[Node], resource: str) -> Node:
        # The most of `resource` left first; ties: not the head, then the nodes' order.
        order = {n.node_id: i for i, n in enumerate(alive)}
        return max(
            candidates,
            key=lambda n: (free.amount(n, resource), not n.is_head, -order[n.node_id]),
        )

    learner: list[Slot] = []
    rank_bundle = demand.bundle("learner")
    for group in range(demand.learner_nodes):
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
        node = most_free(fitting, gpu)
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
                    group,
                    local,
                )
            )

    actors: list[Slot] = []
    actor_bundle = demand.bundle("actor")
    for index in range(demand.actor_replicas):
        fitting = [n for n in gpu_nodes if free.fits(n, actor_bundle)]
        if not fitting:
            raise PlanError(
                f"no GPU node has room for actor replica {index} ({actor_bundle}) after the "
                f"learner and {index} replicas: lower ray.actor_replicas, ray.cpus_per_actor "
                f"or ray.gpus_per_actor, or add GPU nodes"
            )
        node = most_free(fitting, gpu)
        free.take(node, actor_bundle)
        actors.append(Slot(f"actor-{index}", "actor", index, node.node_id, node.ip, actor_bundle))

    envservers: list[Slot] = []
    env_bundle = demand.bundle("envserver")
    for index in range(demand.envservers):
        fitting = [n for n in cpu_nodes if free.fits(n, env_bundle)]
        if not fitting:
            fitting = [n for n in gpu_nodes if free.fits(n, env_bundle)]
            if fitting and not any("env server" in note for note in notes):
                notes.append(
                    "no CPU node (a node without " + gpu + ") has room for env servers: "
                    "they use spare CPUs of GPU nodes"
                )
        if not fitting:
            raise PlanError(
                f"no node has room for env server {index} ({env_bundle}): lower "
                f"ray.envservers or ray.cpus_per_envserver, or add CPU nodes"
            )
        node = most_free(fitting, "CPU")
        free.take(node, env_bundle)
        envservers.append(
            Slot(f"envserver-{index}", "envserver", index, node.node_id, node.ip, env_bundle)
        )

    return Plan(nats, tuple(envservers), tuple(actors), tuple(learner), tuple(notes))


# ---- ports ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PortBases:
    """The first port of each kind on a host (the roles' config values)."""

    nats: int = 4222
    envserver: int = 50051
    envserver_metrics: int = 9400
    actor_metrics: int = 9500
    learner_metrics: int = 9300
    weight_store: int = 29650
    master: int = 29500

    @classmethod
    def from_config(cls, run) -> PortBases:
        return cls(
            nats=run.ray.nats_port,
            envserver=run.envserver.port,
            envserver_metrics=run.envserver.metrics_port or 9400,
            actor_metrics=run.actor.metrics_port,
            learner_metrics=run.learner.metrics_port,
            weight_store=run.learner.weight_sync.store_port,
            master=run.ray.master_port,
        )


def port_needs(plan: Plan) -> list[tuple[str, str, str]]:
    """(slot name, port kind, host) for every port the run listens on."""
    needs = [("nats", "nats", plan.nats.ip)]
    for slot in plan.envservers:
        needs += [(slot.name, "envserver", slot.ip), (slot.name, "envserver_metrics", slot.ip)]
    for slot in plan.learner:
        if slot.local_rank == 0:  # rank 0 serves /metrics; every node's first rank the probes
            needs.append((slot.name, "learner_metrics", slot.ip))
        if slot.index == 0:
            needs += [(slot.name, "weight_store", slot.ip), (slot.name, "master", slot.ip)]
    for slot in plan.actors:
        needs.append((slot.name, "actor_metrics", slot.ip))
    return needs


def assign_ports(plan: Plan, port_for: Callable[[str, str, int], int]) -> dict[str, dict[str, int]]:
    """slot name -> {kind: port}; `port_for(host, kind, k)` numbers the k-th port of a kind
    on a host."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    ports: dict[str, dict[str, int]] = defaultdict(dict)
    for name, kind, host in port_needs(plan):
        ports[name][kind] = port_for(host, kind, counts[host, kind])
        counts[host, kind] += 1
    return dict(ports)


def fixed_ports(plan: Plan, bases: PortBases) -> dict[str, dict[str, int]]:
    """The base port + k for the k-th process of a kind on one host."""
    return assign_ports(plan, lambda host, kind, k: getattr(bases, kind) + k)


def ports_from_pools(plan: Plan, pools: Mapping[str, list[int]]) -> dict[str, dict[str, int]]:
    """Ports taken in turn from each host's pool (free ports the driver found there)."""
    taken: dict[str, int] = defaultdict(int)

    def take(host: str, kind: str, k: int) -> int:
        port = pools[host][taken[host]]
        taken[host] += 1
        return port

    return assign_ports(plan, take)


def ports_per_host(plan: Plan) -> dict[str, int]:
    """How many ports the run listens on at each host."""
    counts: dict[str, int] = defaultdict(int)
    for _, _, host in port_needs(plan):
        counts[host] += 1
    return dict(counts)


# ---- what each process runs -------------------------------------------------------------------


PYTHON = "python"
"""First word of every command: the node's Python (the Ray worker's interpreter) runs it."""


def base_wiring(
    plan: Plan, ports: Mapping[str, Mapping[str, int]], run_dir: Path, model_dir: Path
) -> list[str]:
    """deploy/wiring.py's overrides for this run: the broker on the head, every env server's
    address, the first learner and actor ports (each process's own ports follow)."""
    from deploy.wiring import wiring

    rank0 = plan.learner[0].name
    first = {
        "nats": ports["nats"]["nats"],
        "learner": ports[rank0]["learner_metrics"],
        "weight_store": ports[rank0]["weight_store"],
        "actor": ports[plan.actors[0].name]["actor_metrics"],
        "envserver_grpc": ports[plan.envservers[0].name]["envserver"],
        "envserver": ports[plan.envservers[0].name]["envserver_metrics"],
    }
    return wiring(
        run_dir,
        model_dir,
        first,
        nats_host=plan.nats.ip,
        envserver_addresses=envserver_addresses(plan, ports),
    )


def envserver_addresses(plan: Plan, ports: Mapping[str, Mapping[str, int]]) -> list[str]:
    return [f"{s.ip}:{ports[s.name]['envserver']}" for s in plan.envservers]


def commands(
    plan: Plan,
    ports: Mapping[str, Mapping[str, int]],
    *,
    config_path: Path,
    run_dir: Path,
    args: Sequence[str],
    bind_host: str = "",
) -> dict[str, list[str]]:
    """slot name -> its command line: the same entry points as the console scripts
    (`learner --config C`, `actor --config C --replicas 1`, `envserver --config C`) and
    `python -m broker serve`, with `args` (the wiring, then the user's overrides) and last
    the process's own host and ports."""
    # Options first: the roles' parsers take no option after the first override.
    cfg = ["--config", str(config_path)]
    out: dict[str, list[str]] = {}
    nats = plan.nats
    out[nats.name] = [
        PYTHON, "-m", "broker", "serve",
        "--host", bind_host or nats.ip,
        "--port", str(ports[nats.name]["nats"]),
        "--store-dir", str(run_dir / "nats"),
    ]  # fmt: skip
    for slot in plan.envservers:
        own = ports[slot.name]
        out[slot.name] = [
            PYTHON, "-m", "envservers.cli", *cfg, *args,
            f"envserver.host={bind_host or slot.ip}",
            f"envserver.port={own['envserver']}",
            f"envserver.metrics_port={own['envserver_metrics']}",
        ]  # fmt: skip
    rank0 = plan.learner[0]
    for slot in plan.learner:
        group_first = next(s for s in plan.learner if s.group == slot.group and s.local_rank == 0)
        out[slot.name] = [
            PYTHON, "-m", "learner.cli", *cfg, *args,
            f"learner.metrics_host={bind_host or slot.ip}",
            f"learner.metrics_port={ports[group_first.name]['learner_metrics']}",
            f"learner.weight_sync.store_host={rank0.ip}",
            f"learner.weight_sync.store_port={ports[rank0.name]['weight_store']}",
        ]  # fmt: skip
    for slot in plan.actors:
        out[slot.name] = [
            PYTHON, "-m", "actors.cli", *cfg, "--replicas", "1", *args,
            f"actor.metrics_host={bind_host or slot.ip}",
            f"actor.metrics_port={ports[slot.name]['actor_metrics']}",
        ]  # fmt: skip
    return out


def learner_env(
    plan: Plan,
    ports: Mapping[str, Mapping[str, int]],
    gpu_ids: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, dict[str, str]]:
    """Learner rank -> the torch.distributed environment torchrun would give it.

    `gpu_ids`: the GPU ids Ray assigned each rank (`ray.get_gpu_ids()`). As Ray Train does,
    every rank of a node sees all the node's run GPUs (CUDA_VISIBLE_DEVICES, so NCCL can use
    peer-to-peer between them) and LOCAL_RANK is the position of its own GPU among them."""
    gpu_ids = gpu_ids or {}
    rank0 = plan.learner[0]
    env: dict[str, dict[str, str]] = {}
    for group in plan.learner_groups():
        visible = sorted({g for s in group for g in gpu_ids.get(s.name, [])}, key=_gpu_key)
        for slot in group:
            own = list(gpu_ids.get(slot.name, []))
            local = visible.index(own[0]) if own and visible else slot.local_rank
            rank_env = {
                "RANK": str(slot.index),
                "WORLD_SIZE": str(len(plan.learner)),
                "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(len(group)),
                "GROUP_RANK": str(slot.group),
                "MASTER_ADDR": rank0.ip,
                "MASTER_PORT": str(ports[rank0.name]["master"]),
            }
            if visible:
                rank_env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
            env[slot.name] = rank_env
    return env


def _gpu_key(gpu_id: str) -> tuple[int, str]:
    return (int(gpu_id), "") if str(gpu_id).isdigit() else (1 << 30, str(gpu_id))


def metrics_targets(plan: Plan, ports: Mapping[str, Mapping[str, int]]) -> dict:
    """The run's /metrics endpoints as `host:port` per job (for Prometheus)."""
    rank0 = plan.learner[0]
    return {
        "learner": [f"{rank0.ip}:{ports[rank0.name]['learner_metrics']}"],
        "actor": [f"{s.ip}:{ports[s.name]['actor_metrics']}" for s in plan.actors],
        "envserver": [f"{s.ip}:{ports[s.name]['envserver_metrics']}" for s in plan.envservers],
    }


def to_json_text(value) -> str:
    return json.dumps(value, indent=2, sort_keys=False) + "\n"
