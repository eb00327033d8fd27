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
head node (deploy/ray_roles.py) that creates the placement groups and one Ray actor per
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
import signal
import sys
import time
from pathlib import Path

from deploy import progress
from deploy.config import RayRunConfig, RunConfig, load_run_config
from deploy.ray_plan import (
    Demand,
    Node,
    Plan,
    PlanError,
    PortBases,
    base_wiring,
    commands,
    envserver_addresses,
    fixed_ports,
    make_plan,
    metrics_targets,
    ports_from_pools,
    ports_per_host,
)
from deploy.wiring import wiring

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "demo.toml"
STATE_FILE = "ray_run.json"
EVENTS_FILE = "events.jsonl"
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

    prefix = f"{namespace}/{run_id}/"
    return {
        pg_id: info["name"]
        for pg_id, info in placement_group_table().items()
        if info.get("name", "").startswith(prefix) and info.get("state") != "REMOVED"
    }


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
        return fixed_ports(plan, PortBases.from_config(run))
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from deploy.ray_roles import free_ports_on_node

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


def up(config_path: Path, overrides: list[str], *, detach: bool) -> int:
    try:
        run = load_run_config(config_path, _placeholder_wiring() + overrides)
        if run.learner is None or run.actor is None or run.envserver is None:
            raise ValueError(f"{config_path}: a run needs [learner], [actor] and [envserver]")
    except ValueError as e:
        _err(f"ray_cluster up: {e}")
        return 2
    namespace = run.ray.namespace
    ray = connect(namespace)
    existing = run_actors(ray, namespace)
    if existing:
        _err(
            f"ray_cluster up: run(s) {', '.join(sorted(existing))} already on this cluster "
            f"(namespace {namespace}); `make cluster-down TARGET=ray` first"
        )
        return 2
    nodes = alive_nodes(ray)
    try:
        plan = make_plan(nodes, Demand.from_config(run))
        run_dir, resumed = _run_dir(run.ray)
    except (PlanError, ValueError) as e:
        _err(f"ray_cluster up: {e}")
        return 2
    run_id = run_dir.name
    ports = _ports(ray, plan, run)
    model_dir = run_dir / "model"
    args = base_wiring(plan, ports, run_dir, model_dir) + list(overrides)
    try:
        run = load_run_config(config_path, args)  # the whole file, wired, before anything starts
    except ValueError as e:
        _err(f"ray_cluster up: {e}")
        return 2
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
    log_dir = run_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    events = run_dir / EVENTS_FILE
    state = {
        "run_id": run_id,
        "namespace": namespace,
        "ray_address": os.environ.get("RAY_ADDRESS", "auto"),
        "supervisor": f"{run_id}/supervisor",
        "actors": [f"{run_id}/{slot.name}" for slot in plan.slots],
        "placement_groups": [f"{namespace}/{run_id}/{what}" for what in _pg_names(plan)],
        "plan": plan.to_json(),
        "ports": ports,
        "envserver_addresses": envserver_addresses(plan, ports),
        "commands": argv,
    }
    (run_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    targets = metrics_targets(plan, ports)
    (run_dir / "metrics_ports.json").write_text(
        json.dumps({"targets": targets, "actor_replicas": len(plan.actors)}, indent=2) + "\n"
    )
    _say(f"run directory: {run_dir}  ({run_dir.parent / 'latest'})")
    _say(f"plan ({len(nodes)} nodes):\n{plan.describe(nodes)}")

    env = {k: v for k, v in os.environ.items() if k.startswith(PASSED_ENV_PREFIXES)}
    launch = {
        "run_id": run_id,
        "namespace": namespace,
        "plan": plan.to_json(),
        "ports": ports,
        "argv": argv,
        "env": env,
        "cwd": str(REPO_ROOT),
        "log_dir": str(log_dir),
        "events": str(events),
        "gpu_resource": run.ray.gpu_resource,
        "max_restarts": run.ray.max_restarts,
        "learner_max_restarts": run.ray.learner_max_restarts,
        "placement_timeout_s": run.ray.placement_timeout_s,
        "nats_port": ports["nats"]["nats"],
    }
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from deploy.ray_roles import RunSupervisor

    supervisor = (
        ray.remote(RunSupervisor)
        .options(
            name=f"{run_id}/supervisor",
            namespace=namespace,
            lifetime="detached",
            max_restarts=0,
            max_concurrency=8,
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(plan.nats.node_id, soft=False),
        )
        .remote(launch)
    )
    _say("placing the run (placement groups, then nats-server, env servers, learner, actors) ...")
    try:
        ray.get(supervisor.start.remote(), timeout=run.ray.placement_timeout_s + 600)
    except Exception as e:
        _err(f"ray_cluster up: the run could not start: {e}")
        _down_run(ray, namespace, run_id)
        return 1
    supervisor.supervise.remote()
    _say(
        f"started nats-server ({plan.nats.ip}:{ports['nats']['nats']}), "
        f"{len(plan.envservers)} env servers, {len(plan.learner)} learner ranks, "
        f"{len(plan.actors)} actor replicas; logs in {log_dir}; metrics at {targets}"
    )
    if detach:
        _say("detached: the run goes on on the cluster; `make cluster-down TARGET=ray` stops it")
        return 0
    return follow(ray, supervisor, run_dir, run.learner.total_steps)


def _pg_names(plan: Plan) -> list[str]:
    return ["envservers", *(f"learner-{g}" for g in range(len(plan.learner_groups()))), "actors"]


def _event_line(event: dict) -> str | None:
    role, kind = event.get("role"), event.get("event")
    if kind == "started" and event.get("restarted"):
        return f"  {role} restarted by Ray on {event.get('node')} (pid {event.get('pid')})"
    if kind == "exited" and not event.get("stopping") and event.get("code") != 0:
        return f"  {role} exited with code {event.get('code')}"
    if role == "supervisor" and kind in ("learner restart", "failed"):
        return f"  supervisor: {kind} {event.get('attempt') or event.get('detail') or ''}".rstrip()
    return None


def follow(ray, supervisor, run_dir: Path, total_steps: int) -> int:
    """Progress lines until the run ends; Ctrl-C leaves the run going."""
    interrupted = []
    signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    signal.signal(signal.SIGTERM, lambda *_: interrupted.append(True))
    metrics_path = run_dir / "metrics.jsonl"
    events_path = run_dir / EVENTS_FILE
    offset, events_offset = 0, 0
    records: list[dict] = []
    last_eval, first_train = None, None
    status = {"state": "running"}
    next_status = 0.0
    printed: set[tuple] = set()
    metrics_file = None
    while True:
        # A restarted learner cuts metrics.jsonl back to its checkpoint (a new file, put in
        # place atomically) and writes the steps since again: read it again from the top.
        now_file = _file_identity(metrics_path)
        if now_file[0] != (metrics_file or now_file)[0] or now_file[1] < offset:
            offset, records, first_train = 0, [], None  # its clock (wall_s) starts again
        metrics_file = now_file
        new, offset = progress.read_records(metrics_path, offset)
        for record in new:
            records.append(record)
            key = (record["kind"], record.get("version"))
            if key in printed:
                continue
            printed.add(key)
            if record["kind"] == "eval":
                last_eval = record
                _say(progress.eval_line(record))
            elif record["kind"] == "train":
                first_train = first_train or record
                _say(
                    progress.progress_line(
                        record, total_steps=total_steps, last_eval=last_eval, first=first_train
                    )
                )
        events, events_offset = progress.read_records(events_path, events_offset)
        for event in events:
            line = _event_line(event)
            if line:
                _say(line)
        if time.monotonic() >= next_status:
            try:
                status = ray.get(supervisor.status.remote(), timeout=30)
            except Exception as e:
                _err(f"\nthe run's supervisor is gone ({type(e).__name__}); see {run_dir}/logs")
                return 1
            next_status = time.monotonic() + 2.0
        if status["state"] == "finished":
            new, offset = progress.read_records(metrics_path, offset)
            records.extend(new)
            _finish(run_dir, records)
            _say("every process of the run has stopped; `make cluster-down TARGET=ray` clears it")
            return 0
        if status["state"] == "failed":
            _err(f"\nthe run failed: {status['detail']}; logs in {run_dir / 'logs'}")
            return 1
        if interrupted:
            _err("\nstopped following; the run goes on (`make cluster-down TARGET=ray` stops it)")
            return 130
        time.sleep(0.5)


def _file_identity(path: Path) -> tuple[int | None, int]:
    """(inode, size) of `path`; (None, 0) while it does not exist."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None, 0
    return stat.st_ino, stat.st_size


def _finish(run_dir: Path, records: list[dict]) -> None:
    summary = progress.summarize(records)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_path = progress.plot(records, run_dir / "progress.png")
    _say("\n" + progress.summary_table(summary))
    _say(f"\nsummary: {run_dir / 'summary.json'}\nplot:    {plot_path}")


# ---- down ----------------------------------------------------------------------------------------


def _down_run(ray, namespace: str, run_id: str) -> bool:
    """Stop one run: every process, actor and placement group. True when none is left."""
    from ray.util.placement_group import PlacementGroup

    names = run_actors(ray, namespace, run_id).get(run_id, [])
    supervisor_name = f"{run_id}/supervisor"
    if supervisor_name in names:
        try:
            handle = ray.get_actor(supervisor_name, namespace=namespace)
            ray.get(handle.stop.remote(), timeout=300)
        except Exception as e:
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
            except Exception:
                pass  # dead already
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


def down(run_id: str | None, namespace: str) -> int:
    ray = connect(namespace)
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


def status(namespace: str) -> int:
    ray = connect(namespace)
    runs = run_actors(ray, namespace)
    if not runs:
        _say(f"no Tether run on this Ray cluster (namespace {namespace})")
    for rid in sorted(runs):
        try:
            handle = ray.get_actor(f"{rid}/supervisor", namespace=namespace)
            info = ray.get(handle.status.remote(), timeout=30)
            _say(json.dumps(info, indent=2))
        except Exception as e:
            _say(f"{rid}: no supervisor ({type(e).__name__}); actors {runs[rid]}")
    return 0


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
        if args.action == "down":
            return down(args.run, namespace)
        return status(namespace)
    except NoCluster as e:
        _err(f"ray_cluster {args.action}: {e}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
