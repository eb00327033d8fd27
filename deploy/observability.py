"""Render the Prometheus config of one Tether run from the ports its processes serve /metrics on.

    runs/<id>/metrics_ports.json  ──►  <out>/prometheus.yml  (jobs learner, actor, envserver)
    (written by deploy/local.py)       <out>/run_rules.yml   (the run's staleness bound)

`metrics_ports.json` is `{"learner": P, "actor": P, "envserver": P}`, or for a run on several
hosts (the Ray driver) `{"targets": {"learner": ["host:port"], "actor": [...], "envserver":
[...]}}`, one target per process. Actor replica i serves
on `actor + i` (actors/actor.py), so the actor job gets one target per replica, labelled
`replica="i"`; "actor" may also be a list of ports, one per replica, and an optional
`"actor_replicas"` key gives the replica count. The alert rules (deploy/prometheus/alerts.yml)
are static; the one number of the run they need, the learner's `max_staleness` (read from the
run's frozen config), goes into a recording rule `tether:learner_max_staleness` in
`run_rules.yml`; an "auto" bound's rule is the learner's gauge of the bound in force.

    python -m deploy.observability                    # runs/latest -> runs/latest/prometheus/
    python -m deploy.observability --run runs/X --actor-replicas 2 --max-staleness auto --start

`--start` then runs Prometheus (exec) with its storage in `<out>/data`. The shipped
deploy/prometheus/prometheus.yml and run_rules.yml are this module's output for the roles'
default ports (`--write-shipped` rewrites them; a test fails when they drift).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS_DIR = REPO_ROOT / "deploy" / "prometheus"
ALERTS_FILE = PROMETHEUS_DIR / "alerts.yml"
RUN_RULES_NAME = "run_rules.yml"
JOBS = ("learner", "actor", "envserver")
DEFAULT_PORTS = {"learner": 9300, "actor": 9500, "envserver": 9400}
"""The roles' default /metrics ports (learner/config.py, actors/config.py, envservers/config.py)."""
STALENESS_BUCKETS = 9
"""learner/metrics.py's staleness histogram has buckets le = 0.0 .. 8.0 (then +Inf)."""
HEADER = "# Rendered by deploy/observability.py; edit that, not this file.\n"


def bound_of(learner: dict) -> tuple[int | str, int]:
    """(max_staleness, max_staleness_limit) of a config's [learner] table, the learner's
    defaults where it says nothing."""
    from learner.config import LearnerConfig

    fields = LearnerConfig.model_fields
    return (
        learner.get("max_staleness", fields["max_staleness"].default),
        learner.get("max_staleness_limit", fields["max_staleness_limit"].default),
    )


def run_bound(run_dir: Path) -> tuple[int | str, int]:
    """The bound a run was launched with (its frozen config), else the learner's default."""
    from deploy.frozen_config import frozen_path

    path = frozen_path(run_dir)
    sections = yaml.safe_load(path.read_text()) if path.is_file() else {}
    return bound_of((sections or {}).get("learner") or {})


def default_actor_replicas() -> int:
    from deploy.local import LocalRunConfig

    return LocalRunConfig.model_fields["actor_replicas"].default


def actor_ports(ports: dict, actor_replicas: int | None) -> list[int]:
    """The /metrics port of every actor replica: a list as given, or consecutive from the
    first port (`actor_replicas` of them, else ports["actor_replicas"], else 1)."""
    value = ports["actor"]
    if isinstance(value, list):
        if actor_replicas is not None and actor_replicas != len(value):
            raise ValueError(f"{len(value)} actor ports given but actor_replicas={actor_replicas}")
        return [int(p) for p in value]
    count = actor_replicas if actor_replicas is not None else int(ports.get("actor_replicas", 1))
    if count < 1:
        raise ValueError(f"actor_replicas must be at least 1, got {count}")
    return [int(value) + i for i in range(count)]


def scrape_config(
    ports: dict,
    *,
    actor_replicas: int | None = None,
    host: str = "127.0.0.1",
    scrape_interval: str = "5s",
    rule_files: list[str] | None = None,
) -> dict:
    """The prometheus.yml content (as a dict) for one run's /metrics ports."""
    if "targets" in ports:  # a run on several hosts (the Ray driver): host:port per job
        return _config(
            {job: _host_targets(ports["targets"], job) for job in JOBS}, scrape_interval, rule_files
        )
    missing = [job for job in JOBS if job not in ports]
    if missing:
        raise ValueError(f"metrics ports: missing {missing} (have {sorted(ports)})")
    for job in ("learner", "envserver"):
        if not isinstance(ports[job], int) or not 0 < ports[job] < 65536:
            raise ValueError(f"metrics ports: {job} must be a port number, got {ports[job]!r}")
    actor_targets = [
        {"targets": [f"{host}:{port}"], "labels": {"replica": str(i)}}
        for i, port in enumerate(actor_ports(ports, actor_replicas))
    ]
    jobs = {
        "learner": [{"targets": [f"{host}:{ports['learner']}"]}],
        "actor": actor_targets,
        "envserver": [{"targets": [f"{host}:{ports['envserver']}"]}],
    }
    return _config(jobs, scrape_interval, rule_files)


def _host_targets(targets: dict, job: str) -> list[dict]:
    """`{"targets": {job: ["host:port", ...]}}`: one static config per target; actor
    replicas labelled with their number (`replica`), as on one host."""
    found = targets.get(job)
    if not found or not all(isinstance(t, str) and t.rpartition(":")[2].isdigit() for t in found):
        raise ValueError(f"metrics targets: {job} must be a list of host:port, got {found!r}")
    return [
        {"targets": [target], **({"labels": {"replica": str(i)}} if job == "actor" else {})}
        for i, target in enumerate(found)
    ]


def _config(jobs: dict, scrape_interval: str, rule_files: list[str] | None) -> dict:
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": list(["alerts.yml", RUN_RULES_NAME] if rule_files is None else rule_files),
        "scrape_configs": [{"job_name": job, "static_configs": jobs[job]} for job in JOBS],
    }


def run_rules(max_staleness: int | str, limit: int | None = None) -> dict:
    """Recording rules that carry the run's staleness bound into the alerts and the dashboard:

        tether:learner_max_staleness                     the bound (a constant series; with
                                                         "auto", the bound in force)
        tether:learner_staleness_at_bound:ratio_rate15m  fraction of the groups trained in
                                                         the last 15 min whose staleness
                                                         equals the bound (bound >= 1 only)

    Staleness is an integer, so "at the bound" is exactly 1 - P(staleness <= bound - 1), read
    from the histogram's `le` bucket (histogram_quantile would interpolate inside a bucket).
    An "auto" bound (`limit`: its max_staleness_limit) moves, so its share reads the bucket
    below the bound in force now: one term per bound it can take, each kept only while the
    learner's gauge holds that bound."""
    from learner.staleness import check_max_staleness

    if max_staleness == "auto":
        if limit is None or limit < 1:
            raise ValueError(f"an auto bound needs its max_staleness_limit >= 1, got {limit}")
        in_force = "max(tether_learner_staleness_bound)"
        terms = [f"({_at_bound(k)} and on() {in_force} == {k})"
                 for k in range(1, min(limit, STALENESS_BUCKETS) + 1)]  # fmt: skip
        return _rules(in_force, " or ".join(terms))
    if not isinstance(max_staleness, int):
        raise ValueError(f'max_staleness must be an integer or "auto", got {max_staleness!r}')
    check_max_staleness(max_staleness)
    in_range = 1 <= max_staleness <= STALENESS_BUCKETS
    return _rules(f"vector({max_staleness})", _at_bound(max_staleness) if in_range else None)


def _at_bound(bound: int) -> str:
    below = f'tether_learner_staleness_bucket{{le="{bound - 1:.1f}"}}'
    return f"1 - sum(rate({below}[15m])) / sum(rate(tether_learner_staleness_count[15m]))"


def _rules(bound_expr: str, at_bound_expr: str | None) -> dict:
    rules = [{"record": "tether:learner_max_staleness", "expr": bound_expr}]
    if at_bound_expr is not None:
        rules.append(
            {"record": "tether:learner_staleness_at_bound:ratio_rate15m", "expr": at_bound_expr}
        )
    return {"groups": [{"name": "tether_run", "rules": rules}]}


def to_yaml(content: dict) -> str:
    return HEADER + yaml.safe_dump(content, sort_keys=False, default_flow_style=False)


def render(
    ports: dict,
    out_dir: Path,
    *,
    actor_replicas: int | None = None,
    max_staleness: int | str | None = None,
    limit: int | None = None,
    scrape_interval: str = "5s",
) -> Path:
    """Write out_dir/prometheus.yml and out_dir/run_rules.yml; return the former's path.
    `max_staleness` and `limit`: the run's bound (default: the learner's defaults)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    default_bound, default_limit = bound_of({})
    bound = default_bound if max_staleness is None else max_staleness
    limit = default_limit if limit is None else limit
    (out_dir / RUN_RULES_NAME).write_text(to_yaml(run_rules(bound, limit)))
    config = scrape_config(
        ports,
        actor_replicas=actor_replicas,
        scrape_interval=scrape_interval,
        rule_files=[str(ALERTS_FILE), RUN_RULES_NAME],
    )
    path = out_dir / "prometheus.yml"
    path.write_text(to_yaml(config))
    return path


def shipped_files() -> dict[Path, str]:
    """deploy/prometheus/{prometheus.yml, run_rules.yml}: the roles' default ports, one actor
    replica (`actor --replicas` defaults to 1), the default staleness bound."""
    config = scrape_config(DEFAULT_PORTS, actor_replicas=1)
    return {
        PROMETHEUS_DIR / "prometheus.yml": to_yaml(config),
        PROMETHEUS_DIR / RUN_RULES_NAME: to_yaml(run_rules(*bound_of({}))),
    }


def prometheus_command(config_path: Path, *, listen: str = "127.0.0.1:9090") -> list[str]:
    binary = shutil.which("prometheus") or "prometheus"
    return [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={config_path.parent / 'data'}",
        f"--web.listen-address={listen}",
    ]


def _bound_argument(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'an integer or "auto", not {text!r}') from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.observability",
        description="Render a Prometheus config for a Tether run (and optionally start it).",
    )
    parser.add_argument("--run", default="runs/latest", help="run directory (metrics_ports.json)")
    parser.add_argument("--out", default=None, help="output directory (default: <run>/prometheus)")
    parser.add_argument(
        "--actor-replicas",
        type=int,
        default=None,
        help="actor replicas (default: metrics_ports.json, else [local] default)",
    )
    parser.add_argument(
        "--max-staleness",
        type=_bound_argument,
        default=None,
        help="the run's learner.max_staleness, an integer or \"auto\" (default: the run's frozen"
        " config.yaml, else the learner's default)",
    )
    parser.add_argument("--scrape-interval", default="5s")
    parser.add_argument("--listen", default="127.0.0.1:9090", help="Prometheus web address")
    parser.add_argument("--start", action="store_true", help="then run Prometheus (exec)")
    parser.add_argument(
        "--write-shipped",
        action="store_true",
        help="only rewrite deploy/prometheus/{prometheus,run_rules}.yml",
    )
    args = parser.parse_args(argv)
    if args.write_shipped:
        for path, text in shipped_files().items():
            path.write_text(text)
            print(f"wrote {path}")
        return 0

    ports_file = Path(args.run) / "metrics_ports.json"
    try:
        ports = json.loads(ports_file.read_text())
    except FileNotFoundError:
        print(f"observability: no {ports_file}; start a run with `make run` first", file=sys.stderr)
        return 2
    replicas = args.actor_replicas
    if (
        replicas is None
        and "actor_replicas" not in ports
        and not isinstance(ports.get("actor"), list)
    ):
        replicas = default_actor_replicas()
    out_dir = Path(args.out) if args.out else Path(args.run).resolve() / "prometheus"
    bound, limit = run_bound(Path(args.run))
    try:
        path = render(
            ports,
            out_dir,
            actor_replicas=replicas,
            max_staleness=bound if args.max_staleness is None else args.max_staleness,
            limit=limit,
            scrape_interval=args.scrape_interval,
        )
    except ValueError as e:
        print(f"observability: {e}", file=sys.stderr)
        return 2
    command = prometheus_command(path, listen=args.listen)
    print(f"wrote {path}\nrun: {' '.join(command)}", flush=True)
    if args.start:
        os.execv(command[0], command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
