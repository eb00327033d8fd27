"""Preparing a Ray run before anything starts on the cluster: validate the config (first
with stand-in ports, then wired with the real ones), refuse while another run is on the
cluster, plan it on the live nodes, then make its run directory (`<ray.runs_dir>/<id>`, on a
filesystem every node mounts at the same path; `latest` points at it) with the demo inputs
([prepare]), `logs/`, `ray_run.json` and `metrics_ports.json`. ValueError (PlanError) says
what is wrong; nothing is made before the whole wired file validates.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from common.config import read_sections
from deploy.config import RayRunConfig, RunConfig, load_run_config
from deploy.frozen_config import freeze, frozen_path
from deploy.ray_commands import base_wiring, commands
from deploy.ray_down import run_actors
from deploy.ray_driver import REPO_ROOT, alive_nodes, run_ports
from deploy.ray_plan import plan_run
from deploy.ray_records import STATE_FILE, Prepared, metrics_ports, run_state
from deploy.wiring import wiring

PLACEHOLDER_PORTS = {
    "nats": 4222,
    "learner": 9300,
    "weight_store": 29650,
    "actor": 9500,
    "envserver_grpc": 50051,
    "envserver": 9400,
}


def placeholder_wiring() -> list[str]:
    """Stand-in paths and ports, to validate the file before the real ones are known."""
    return wiring(Path("/run"), Path("/model"), PLACEHOLDER_PORTS)


def prepare(ray, config_path: Path, overrides: list[str]) -> Prepared:
    """Validate, plan, wire, validate the wired file, then make the run directory (its
    inputs, ray_run.json, metrics_ports.json). ValueError (PlanError) says what is wrong."""
    run = load_run_config(config_path, placeholder_wiring() + overrides)
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
    if resumed and frozen_path(run_dir).is_file():  # a resumed run: its own config, not the file's
        config_path = frozen_path(run_dir)
    ports = run_ports(ray, plan, run)
    args = base_wiring(plan, ports, run_dir, run_dir / "model") + list(overrides)
    run = load_run_config(config_path, args)  # the whole file, wired, before anything starts
    sections = read_sections(config_path, args)
    argv = commands(
        plan,
        ports,
        config_path=frozen_path(run_dir),  # every process and every restart reads only this
        run_dir=run_dir,
        args=[],
        bind_host=run.ray.bind_host,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    digest = freeze(run_dir, sections)
    print(f"config frozen: {frozen_path(run_dir)} (sha256 {digest[:12]})", flush=True)
    _point_latest(run_dir)
    _prepare_inputs(run, run_dir, resumed)
    (run_dir / "logs").mkdir(exist_ok=True)
    prepared = Prepared(run, plan, nodes, run_dir, ports, argv)
    _write_state(prepared)
    return prepared


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


def _point_latest(run_dir: Path) -> None:
    latest = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, latest)


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
            print("building a random-weight tiny model (seconds; cached) ...", flush=True)
        prepare_model(prepare)
    if not resumed or not (run_dir / "data" / "train.jsonl").exists():
        prepare_data(prepare)
    return run_dir / "model"


def _write_state(prepared: Prepared) -> None:
    """ray_run.json (what belongs to the run, for people and `down`) and metrics_ports.json
    (every /metrics as host:port, for `make observe`)."""
    state = run_state(prepared, os.environ.get("RAY_ADDRESS", "auto"))
    (prepared.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    targets = metrics_ports(prepared)
    (prepared.run_dir / "metrics_ports.json").write_text(json.dumps(targets, indent=2) + "\n")
