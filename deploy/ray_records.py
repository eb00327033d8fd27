"""What a Ray run is once prepared, as plain data: the `Prepared` run, the record of it in
`ray_run.json` (what belongs to the run, for people and `down`), the Prometheus targets in
`metrics_ports.json`, and the launch spec its supervisor gets (it crosses to the head node
as plain data). Pure: the plan, ports and command lines in, dicts out; deploy/ray_prepare.py
writes them and deploy/ray_driver.py hands the spec to Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from common.fleet import leave_grace_s
from common.supervision import EVENTS_FILE
from deploy.config import RunConfig
from deploy.frozen_config import frozen_path
from deploy.ray_commands import actor_head, envserver_addresses, metrics_targets
from deploy.ray_plan import Node, Plan, bundle, gpus_per_actor

STATE_FILE = "ray_run.json"
PASSED_ENV_PREFIXES = (
    "WANDB_", "TETHER_", "NCCL_", "TORCH_NCCL_", "GLOO_", "HF_", "VLLM_", "NATS_"
)  # fmt: skip
"""Settings of the driver's environment that every process of the run gets too."""


@dataclass
class Prepared:
    """A run ready to hand to its supervisor: validated, planned, its directory made."""

    run: RunConfig
    plan: Plan
    nodes: list[Node]
    run_dir: Path
    ports: dict[str, dict[str, int]]
    argv: dict[str, list[str]]


def pg_names(plan: Plan) -> list[str]:
    """The run's placement groups, as the supervisor names them under `<namespace>/<run id>/`."""
    return ["envservers", *(f"learner-{g}" for g in range(len(plan.learner_groups()))), "actors"]


def run_state(prepared: Prepared, ray_address: str) -> dict:
    """The content of ray_run.json."""
    run_id, namespace, plan = prepared.run_dir.name, prepared.run.ray.namespace, prepared.plan
    return {
        "run_id": run_id,
        "namespace": namespace,
        "ray_address": ray_address,
        "supervisor": actor_name(run_id, "supervisor"),
        "actors": [actor_name(run_id, slot.name) for slot in plan.slots],
        "placement_groups": [pg_name(namespace, run_id, what) for what in pg_names(plan)],
        "plan": plan.to_json(),
        "ports": prepared.ports,
        "envserver_addresses": envserver_addresses(plan, prepared.ports),
        "commands": prepared.argv,
    }


def metrics_ports(prepared: Prepared) -> dict:
    """The content of metrics_ports.json: every /metrics as host:port, for `make observe`."""
    return {
        "targets": metrics_targets(prepared.plan, prepared.ports),
        "actor_replicas": len(prepared.plan.actors),
    }


def launch_spec(prepared: Prepared, *, environ: Mapping[str, str], cwd: Path) -> dict:
    """Everything the supervisor needs; `environ` is the driver's, filtered here."""
    run, run_dir = prepared.run, prepared.run_dir
    return {
        "run_id": run_dir.name,
        "namespace": run.ray.namespace,
        "plan": prepared.plan.to_json(),
        "ports": prepared.ports,
        "argv": prepared.argv,
        "env": {k: v for k, v in environ.items() if k.startswith(PASSED_ENV_PREFIXES)},
        "cwd": str(cwd),
        "log_dir": str(run_dir / "logs"),
        "events": str(run_dir / EVENTS_FILE),
        "gpu_resource": run.ray.gpu_resource,
        "restarts": run.restarts.model_dump(),
        "placement_timeout_s": run.ray.placement_timeout_s,
        "nats_port": prepared.ports["nats"]["nats"],
        "fleet": fleet_spec(prepared) if run.elastic.enabled else None,
    }


def fleet_spec(prepared: Prepared) -> dict:
    """What the supervisor sizes an elastic fleet by (deploy/ray_fleet.py): the bounds, where
    the backlog is read (the learner's /metrics), and how a new replica is started."""
    run, plan, ports = prepared.run, prepared.plan, prepared.ports
    rank0 = plan.learner[0]
    return {
        "bounds": asdict(run.fleet_bounds()),
        "poll_s": run.elastic.poll_s,
        "engine_start_s": run.elastic.engine_start_s,
        "leave_grace_s": leave_grace_s(run.actor.drain_timeout_s),
        "work_url": f"http://{rank0.ip}:{ports[rank0.name]['learner_metrics']}/metrics",
        "actor_head": actor_head(frozen_path(prepared.run_dir), []),
        "bind_host": run.ray.bind_host,
        "bundle": bundle(run.ray, "actor", gpus_per_actor(run)),
    }


def pg_name(namespace: str, run_id: str, what: str) -> str:
    """A run's placement group for `what` (a group of `pg_names`); '' gives the prefix."""
    return f"{namespace}/{run_id}/{what}"


def actor_name(run_id: str, what: str) -> str:
    """A run's named Ray actor: its supervisor, or the process of one slot."""
    return f"{run_id}/{what}"
