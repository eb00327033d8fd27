"""What each process of a Ray run runs, and on which ports: pure functions of the placement
plan (deploy/ray_plan.py) and the run's config.

    port_needs / fixed_ports / ports_from_pools   every port the run listens on, per host
    base_wiring                                   deploy/wiring.py's overrides for this run
    commands                                      each process's command line
    learner_env                                   each learner rank's torch.distributed env
    metrics_targets                               host:port of every /metrics, per job

Ports: the k-th process of a kind on one host gets the kind's base port + k (the bases are
the roles' own config values), so several simulated nodes on one host (tests) never clash.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from deploy.config import RunConfig
from deploy.ray_plan import Plan
from deploy.wiring import wiring


def port_bases(run: RunConfig) -> dict[str, int]:
    """The first port of each kind on a host: the roles' own config values."""
    return {
        "nats": run.ray.nats_port,
        "envserver": run.envserver.port,
        "envserver_metrics": run.envserver.metrics_port or 9400,
        "actor_metrics": run.actor.metrics_port,
        "learner_metrics": run.learner.metrics_port,
        "weight_store": run.learner.weight_sync.store_port,
        "master": run.ray.master_port,
    }


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


def fixed_ports(plan: Plan, bases: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """The base port + k for the k-th process of a kind on one host (`port_bases`)."""
    return assign_ports(plan, lambda host, kind, k: bases[kind] + k)


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
            *_gpu_device(slot.bundle, "learner.device"),
        ]  # fmt: skip
    head = actor_head(config_path, args)
    for slot in plan.actors:
        own = actor_own(slot.ip, ports[slot.name]["actor_metrics"], bind_host, slot.bundle)
        out[slot.name] = head + own
    return out


def actor_head(config_path: Path, args: Sequence[str]) -> list[str]:
    """An actor replica's command line up to its own host and ports: the same for every
    replica, those of an elastic fleet included (deploy/ray_fleet.py)."""
    return [PYTHON, "-m", "actors.cli", "--config", str(config_path), "--replicas", "1", *args]


def actor_own(ip: str, metrics_port: int, bind_host: str, bundle: Mapping[str, float]) -> list[str]:
    """An actor replica's own settings, last on its command line: where it listens."""
    return [
        f"actor.metrics_host={bind_host or ip}",
        f"actor.metrics_port={metrics_port}",
        # Agent workflows run on the env server nodes and call this node's endpoint.
        f"actor.agent_endpoint.host={bind_host or ip}",
        f"actor.agent_endpoint.advertise_host={ip}",
        *_gpu_device(bundle, "actor.engine.device"),
    ]


def _gpu_device(bundle: Mapping[str, float], key: str) -> list[str]:
    """A process the plan gave GPUs must run on them: `key=cuda` makes it refuse to start
    without one (common/cuda_driver.py) instead of falling back to CPU."""
    return [f"{key}=cuda"] if bundle.get("GPU", 0) > 0 else []


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
