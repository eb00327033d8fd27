"""The Ray driver's command line, behind `make cluster-up TARGET=ray` / `make cluster-down
TARGET=ray`: a Tether run on a Ray cluster, Ray placing its processes and the run's
supervisor restarting them.

    python -m deploy.ray_cluster up [--config C] [--detach] [section.key=value ...]
    python -m deploy.ray_cluster down [--run ID]
    python -m deploy.ray_cluster status

`up` connects to the cluster at RAY_ADDRESS (else `ray start`'s local one; deploy/ray_driver.py),
prepares the run (deploy/ray_prepare.py): plans where every process goes (deploy/ray_plan.py:
nats-server on the head, env servers on CPU nodes, learner ranks and actor replicas on GPU
nodes), makes the run directory (`<ray.runs_dir>/<id>`, on a filesystem every node mounts at
the same path) with the demo inputs ([prepare]), wires the addresses through config overrides
as `make run` does (deploy/wiring.py) and validates the whole wired file, then hands the run
to its supervisor, a named, detached Ray actor on the head node (deploy/ray_supervisor.py)
that creates the placement groups and one Ray actor per process. Then it follows the run
(deploy/ray_follow.py): one progress line per training step, each restart as it happens,
and at the end the summary (`summary.json`, `progress.png`), as `make run` does. Ctrl-C (or
`--detach`) leaves the run going on the cluster; `down` stops it.

`down` (deploy/ray_down.py) finds the run's actors and placement groups by name in the cluster
(namespace `ray.namespace`, names `<run id>/...`), asks the supervisor to stop every process,
kills every actor of the run, removes its placement groups, and checks that none is left.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deploy.config import load_run_config
from deploy.ray_commands import metrics_targets
from deploy.ray_down import _down_run, down, status
from deploy.ray_driver import REPO_ROOT, NoCluster, connect, start_supervisor
from deploy.ray_follow import follow
from deploy.ray_prepare import placeholder_wiring, prepare

DEFAULT_CONFIG = REPO_ROOT / "configs" / "demo.toml"


def _say(text: str = "", **kwargs) -> None:
    print(text, flush=True, **kwargs)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def up(config_path: Path, overrides: list[str], *, detach: bool) -> int:
    from ray.exceptions import RayError

    try:
        namespace = load_run_config(config_path, placeholder_wiring() + overrides).ray.namespace
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
