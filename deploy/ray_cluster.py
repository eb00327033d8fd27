"""The Ray driver behind `make cluster-up TARGET=ray` / `make cluster-down TARGET=ray`: a
Tether run on a Ray cluster, with Ray doing placement and restarts.

    python -m deploy.ray_cluster up [--config C] [--detach] [section.key=value ...]
    python -m deploy.ray_cluster down [--run ID]
    python -m deploy.ray_cluster status

`up` connects to the cluster at RAY_ADDRESS (else `ray start`'s local one), plans where every
process goes (deploy/ray_plan.py: nats-server on the head, env servers on CPU nodes, learner
ranks and actor replicas on GPU nodes), makes the run directory (`<ray.runs_dir>/<id>`, on a
filesystem every node mounts at the same path) with the demo inputs ([prepare]), wires the
addresses through config overrides as `make run` does (deploy/wiring.py) and validates the
whole wired file, then hands the run to its supervisor, a named, detached Ray actor on the
head node (deploy/ray_supervisor.py) that creates the placement groups and one Ray actor per
process. Then it follows the run: one progress line per training step, Ray's restarts as
they happen, and at the end the summary (`summary.json`, `progress.png`), as `make run`
does. Ctrl-C (or `--detach`) leaves the run going on the cluster; `down` stops it.

`down` finds the run's actors and placement groups by name in the cluster (namespace
`ray.namespace`, names `<run id>/...`), asks the supervisor to stop every process, kills
every actor of the run, removes its placement groups, and checks that none is left.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from deploy.config import RayRunConfig, RunConfig, load_run_config
from deploy.ray_commands import (
    base_wiring,
    commands,
    envserver_addresses,
    fixed_ports,
    metrics_targets,
    port_bases,
    ports_from_pools,
    ports_per_host,
)
from deploy.ray_down import _down_run, down, run_actors, status
from deploy.ray_follow import EVENTS_FILE, follow
from deploy.ray_plan import Node, Plan, plan_run
from deploy.wiring import wiring

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "demo.toml"
STATE_FILE = "ray_run.json"
PASSED_ENV_PREFIXES = ("WANDB_", "TETHER_", "NCCL_", "GLOO_", "HF_", "VLLM_", "NATS_")
"""Settings of the driver's environment that every process of the run gets too."""
PLACEHOLDER_PORTS = {
    "nats": 4222,
    "learner": 9300,
    "weight_store": 29650,
    "actor": 9500,
    "envserver_grpc": 50051,
    "envserver": 9400,
}


def _say(text: str = "", **kwargs) -> None:
    print(text, flush=True, **kwargs)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---- connecting --------------------------------------------------------------------------------


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


# ---- up ------------------------------------------------------------------------------------------


def _placeholder_wiring() -> list[str]:
    """Stand-in paths and ports, to validate the file before the real ones are known."""
    return wiring(Path("/run"), Path("/model"), PLACEHOLDER_PORTS)


def _run_dir(ray_config: RayRunConfig) -> tuple[Path, bool]:
    runs_dir = Path(ray_config.runs_dir)
    runs_dir = (runs_dir if runs_dir.is_absolute() else REPO_ROOT / runs_dir).resolve()
    if ray_config.resume:
        run_dir = runs_dir / ray_config.resume
        if not run_dir.is_dir():
            raise ValueError(f"ray.resume: no run directory {run_dir}")
        return run_dir, True
    run_dir = runs_dir / time.strftime("%Y%m%d-%H%M%S")
    while run_dir.exists():  # two runs in one second
        run_dir = run_dir.with_name(run_dir.name + "-1")
    return run_dir, False


def _prepare_inputs(run: RunConfig, run_dir: Path, resumed: bool) -> Path:
    """The demo's tiny model and calculator dataset in the run directory ([prepare]); a run
    that names its own model and data overrides the wired paths."""
    from deploy.prepare import prepare_data, prepare_model

    prepare = run.prepare.model_copy(
        update={
            "model_dir": str(run_dir / "model"),
            "data_dir": str(run_dir / "data"),
            # A random-weight build where every node sees it (not this node's cache).
            "cache_dir": run.prepare.cache_dir or str(run_dir / "cache"),
        }
    )
    if not resumed or not (run_dir / "model").exists():
        if not prepare.warm_start:
            _say("building a random-weight tiny model (seconds; cached) ...")
        prepare_model(prepare)
    if not resumed or not (run_dir / "data" / "train.jsonl").exists():
        prepare_data(prepare)
    return run_dir / "model"


def _ports(ray, plan: Plan, run: RunConfig) -> dict[str, dict[str, int]]:
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


def _point_latest(run_dir: Path) -> None:
    latest = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, latest)


@dataclass
class Prepared:
    """A run ready to hand to its supervisor: validated, planned, its directory made."""

    run: RunConfig
    plan: Plan
    nodes: list[Node]
    run_dir: Path
    ports: dict[str, dict[str, int]]
    argv: dict[str, list[str]]


def prepare(ray, config_path: Path, overrides: list[str]) -> Prepared:
    """Validate, plan, wire, validate the wired file, then make the run directory (its
    inputs, ray_run.json, metrics_ports.json). ValueError (PlanError) says what is wrong."""
    run = load_run_config(config_path, _placeholder_wiring() + overrides)
    if run.learner is None or run.actor is None or run.envserver is None:
        raise ValueError(f"{config_path}: a run needs [learner], [actor] and [envserver]")
    existing = run_actors(ray, run.ray.namespace)
    if existing:
        raise ValueError(
            f"run(s) {', '.join(sorted(existing))} already on this cluster (namespace "
            f"{run.ray.namespace}); `make cluster-down TARGET=ray` first"
        )
    nodes = alive_nodes(ray)
    plan = plan_run(run, nodes)
    run_dir, resumed = _run_dir(run.ray)
    ports = _ports(ray, plan, run)
    args = base_wiring(plan, ports, run_dir, run_dir / "model") + list(overrides)
    run = load_run_config(config_path, args)  # the whole file, wired, before anything starts
    argv = commands(
        plan,
        ports,
        config_path=config_path,
        run_dir=run_dir,
        args=args,
        bind_host=run.ray.bind_host,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    _point_latest(run_dir)
    _prepare_inputs(run, run_dir, resumed)
    (run_dir / "logs").mkdir(exist_ok=True)
    prepared = Prepared(run, plan, nodes, run_dir, ports, argv)
    _write_state(prepared)
    return prepared


def _write_state(prepared: Prepared) -> None:
    """ray_run.json (what belongs to the run, for people and `down`) and metrics_ports.json
    (every /metrics as host:port, for `make observe`)."""
    run_id, namespace, plan = prepared.run_dir.name, prepared.run.ray.namespace, prepared.plan
    state = {
        "run_id": run_id,
        "namespace": namespace,
        "ray_address": os.environ.get("RAY_ADDRESS", "auto"),
        "supervisor": f"{run_id}/supervisor",
        "actors": [f"{run_id}/{slot.name}" for slot in plan.slots],
        "placement_groups": [f"{namespace}/{run_id}/{what}" for what in _pg_names(plan)],
        "plan": plan.to_json(),
        "ports": prepared.ports,
        "envserver_addresses": envserver_addresses(plan, prepared.ports),
        "commands": prepared.argv,
    }
    (prepared.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    targets = {"targets": metrics_targets(plan, prepared.ports), "actor_replicas": len(plan.actors)}
    (prepared.run_dir / "metrics_ports.json").write_text(json.dumps(targets, indent=2) + "\n")


def _launch_spec(prepared: Prepared) -> dict:
    """Everything the supervisor needs (it crosses to the head node as plain data)."""
    run, run_dir = prepared.run, prepared.run_dir
    return {
        "run_id": run_dir.name,
        "namespace": run.ray.namespace,
        "plan": prepared.plan.to_json(),
        "ports": prepared.ports,
        "argv": prepared.argv,
        "env": {k: v for k, v in os.environ.items() if k.startswith(PASSED_ENV_PREFIXES)},
        "cwd": str(REPO_ROOT),
        "log_dir": str(run_dir / "logs"),
        "events": str(run_dir / EVENTS_FILE),
        "gpu_resource": run.ray.gpu_resource,
        "max_restarts": run.ray.max_restarts,
        "learner_max_restarts": run.ray.learner_max_restarts,
        "placement_timeout_s": run.ray.placement_timeout_s,
        "nats_port": prepared.ports["nats"]["nats"],
    }


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
        .remote(_launch_spec(prepared))
    )
    ray.get(supervisor.start.remote(), timeout=run.ray.placement_timeout_s + 600)
    supervisor.supervise.remote()
    return supervisor


def up(config_path: Path, overrides: list[str], *, detach: bool) -> int:
    from ray.exceptions import RayError

    try:
        namespace = load_run_config(config_path, _placeholder_wiring() + overrides).ray.namespace
        ray = connect(namespace)
        prepared = prepare(ray, config_path, overrides)
    except ValueError as e:  # a bad config, or a cluster that cannot hold the run
        _err(f"ray_cluster up: {e}")
        return 2
    plan, ports, run_dir = prepared.plan, prepared.ports, prepared.run_dir
    _say(f"run directory: {run_dir}  ({run_dir.parent / 'latest'})")
    _say(f"plan ({len(prepared.nodes)} nodes):\n{plan.describe(prepared.nodes)}")
    _say("placing the run (placement groups, then nats-server, env servers, learner, actors) ...")
    try:
        supervisor = start_supervisor(ray, prepared)
    except RayError as e:  # placement or a process failed: take down what started
        _err(f"ray_cluster up: the run could not start: {e}")
        _down_run(ray, namespace, run_dir.name)
        return 1
    _say(
        f"started nats-server ({plan.nats.ip}:{ports['nats']['nats']}), "
        f"{len(plan.envservers)} env servers, {len(plan.learner)} learner ranks, "
        f"{len(plan.actors)} actor replicas; logs in {run_dir / 'logs'}; "
        f"metrics at {metrics_targets(plan, ports)}"
    )
    if detach:
        _say("detached: the run goes on on the cluster; `make cluster-down TARGET=ray` stops it")
        return 0
    return follow(ray, supervisor, run_dir, prepared.run.learner.total_steps)


def _pg_names(plan: Plan) -> list[str]:
    return ["envservers", *(f"learner-{g}" for g in range(len(plan.learner_groups()))), "actors"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.ray_cluster", description=__doc__)
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--detach", action="store_true", help="up: return once it runs")
    parser.add_argument("--run", default=None, help="down: only this run id (default: all)")
    parser.add_argument("overrides", nargs="*", help="section.key=value (ray.*, learner.*, ...)")
    args = parser.parse_intermixed_args(argv)  # options and overrides in any order
    try:
        import ray  # noqa: F401
    except ImportError:
        _err("ray_cluster: Ray is not installed: pip install -e '.[ray]' (make install does)")
        return 2
    try:
        if args.action == "up":
            return up(args.config.resolve(), list(args.overrides), detach=args.detach)
        try:
            ray_overrides = [o for o in args.overrides if o.startswith("ray.")]
            namespace = load_run_config(None, ray_overrides).ray.namespace
        except ValueError as e:
            _err(f"ray_cluster {args.action}: {e}")
            return 2
        ray = connect(namespace)
        if args.action == "down":
            return down(ray, args.run, namespace)
        return status(ray, namespace)
    except NoCluster as e:
        _err(f"ray_cluster {args.action}: {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
