"""The single-machine launcher behind `make run`: every real part as its own process.

    nats-server ── envserver ── learner ── actor (N replicas, one vLLM engine each)

It builds (or reuses) the tiny model and the calculator dataset, starts the broker, the env
server, the learner and the actors with their addresses wired through config overrides,
streams their logs to `runs/<id>/logs/`, prints one progress line per training step, and at
the end writes `summary.json` and `progress.png` and points `runs/latest` at the run.
A process that dies is restarted, as a cluster would (deploy/supervisor.py: backoff, a
restart budget, liveness probes; the learner resumes from its checkpoint, the broker from
its file store). Ctrl-C, or a process that spent its restart budget, stops everything by
PID; nothing is left running.

    python -m deploy.local [--config configs/demo.toml] [section.key=value ...]
    python -m deploy.local --resume runs/<id>|latest [section.key=value ...]

`--resume` continues a run whose processes all stopped (Ctrl-C, a reboot, a preempted
machine): every process comes back on its directory, so the learner resumes from its newest
checkpoint, the broker from its file store (prompts released, trajectories stored and not
yet trained, the policy KV), under the same run id; a finished run says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

from broker.security import NatsAuth, new_secret
from broker.server import NatsServer
from common.config import load_section, read_sections
from common.placement import visible_gpus
from common.procs import free_port, stop_on_signals
from deploy import progress, run_inputs
from deploy.config import LocalRunConfig, load_run_config
from deploy.frozen_config import freeze, frozen_path
from deploy.gpus import gpu_wiring
from deploy.supervisor import Service, Supervisor, http_probe
from deploy.wiring import demo_format_problem
from deploy.wiring import wiring as _wiring
from learner.sinks import DONE_FILE

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "demo.toml"
LAUNCH_FILE = "launch.json"
"""What started a run: its config file and overrides (`--resume` starts it again so)."""


def free_port_block(size: int, attempts: int = 50) -> int:
    """The first of `size` consecutive free loopback ports."""
    for _ in range(attempts):
        base = free_port()
        if base + size <= 65535 and all(_is_free(base + i) for i in range(1, size)):
            return base
    raise RuntimeError(f"no block of {size} consecutive free ports found")


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def _point_latest(runs_dir: Path, run_dir: Path) -> None:
    latest = runs_dir / "latest"
    tmp = runs_dir / f".latest-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, latest)  # atomic: `latest` always names a whole run


def _prepare_run_dir(
    run_dir: Path,
    local: LocalRunConfig,
    ports: dict[str, int],
    launched: dict | None,
    own_rows: dict | None,
) -> dict[str, int]:
    """The run directory with its dataset, logs folder, what started it (`launched`: a new
    run; None: a resumed one, which has them already) and the metrics ports of its processes
    (for `make observe`); `runs/latest` points at it. Returns those ports."""
    if launched is not None:
        run_dir.mkdir(parents=True)
        run_inputs.write_data(run_dir / "data", local, own_rows)
        (run_dir / "logs").mkdir()
        (run_dir / LAUNCH_FILE).write_text(json.dumps(launched, indent=2) + "\n")
    _point_latest(run_dir.parent, run_dir)
    print(f"run directory: {run_dir}  (runs/latest)", flush=True)
    metrics_ports = {
        "learner": ports["learner"],
        "actor": ports["actor"],
        "envserver": ports["envserver"],
        "actor_replicas": local.actor_replicas,
    }
    (run_dir / "metrics_ports.json").write_text(json.dumps(metrics_ports, indent=2) + "\n")
    return metrics_ports


def bus_credentials(environ=os.environ) -> tuple[NatsAuth, dict[str, str]]:
    """The credentials the run's bus requires, and what the children that use the bus need
    added to their environment: the environment's own (inherited as they are), else a token
    made for this run alone (never written anywhere)."""
    auth = NatsAuth.from_environment(environ)
    if auth is not None:
        return auth, {}
    child_env = {"NATS_TOKEN": new_secret()}
    return NatsAuth.from_environment(child_env), child_env


def _record_config(run_dir: Path, digest: str, resumed_with: list[str] | None) -> None:
    """The frozen config's hash in launch.json; a resume adds its overrides and new hash."""
    record = json.loads((run_dir / LAUNCH_FILE).read_text())
    if resumed_with is None:
        record["config_sha256"] = digest
    else:
        record.setdefault("resumes", []).append(
            {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "overrides": resumed_with,
             "config_sha256": digest}
        )  # fmt: skip
    (run_dir / LAUNCH_FILE).write_text(json.dumps(record, indent=2) + "\n")
    print(f"config frozen: {frozen_path(run_dir)} (sha256 {digest[:12]})", flush=True)


def resumed_run(runs_dir: Path, resume: str) -> tuple[Path, dict]:
    """The run directory `resume` names (`latest`: the newest under `runs_dir`) and what
    started it; ValueError when it is not a run of this launcher."""
    path = runs_dir / "latest" if resume == "latest" else Path(resume)
    run_dir = path.resolve()
    try:
        launched = json.loads((run_dir / LAUNCH_FILE).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(
            f"--resume {resume}: not a run directory of this launcher ({run_dir / LAUNCH_FILE}"
            f" cannot be read: {e})"
        ) from e
    return run_dir, launched


def _plan(config_path: Path, overrides: list[str], resume: str | None):
    """(run directory, config file, overrides, the [local] section, what to record as the
    run's launch): a new run's, or with `resume` the run's frozen config (overrides given now
    on top of it) on its directory (None recorded: it has its record). A run from before
    configs were frozen starts again from its first launch's file and overrides."""
    local = load_section(LocalRunConfig, config_path, "local", overrides)
    runs_dir = (REPO_ROOT / local.runs_dir).resolve()
    if resume is None:
        launched = {"config": str(config_path), "overrides": list(overrides)}
        return runs_dir / _run_id(), config_path, overrides, local, launched
    run_dir, first = resumed_run(runs_dir, resume)
    if frozen_path(run_dir).is_file():
        config_path = frozen_path(run_dir)
        if overrides:
            print(f"resuming with overrides on its frozen config: {' '.join(overrides)}")
    else:
        config_path, overrides = Path(first["config"]), [*first["overrides"], *overrides]
    local = load_section(LocalRunConfig, config_path, "local", overrides)
    return run_dir, config_path, overrides, local, None


def launch(config_path: Path, overrides: list[str], resume: str | None = None) -> int:
    try:
        run_dir, config_path, overrides, local, launched = _plan(config_path, overrides, resume)
        if launched is None and (run_dir / DONE_FILE).is_file():
            done = json.loads((run_dir / DONE_FILE).read_text())
            print(f"{run_dir} finished already (version {done.get('version')}): nothing to"
                  " resume", flush=True)  # fmt: skip
            return 0
        model_dir = run_inputs.model_dir(local)
        # A resumed run has its rows in its directory already.
        own_rows = run_inputs.own_rows(local) if launched is not None else None
        ports = {name: free_port() for name in ("nats", "learner", "envserver", "envserver_grpc")}
        ports["weight_store"] = free_port()
        ports["actor"] = free_port_block(local.actor_replicas)  # replica i serves on base + i
        args = _wiring(run_dir, model_dir, ports) + list(overrides)
        # The whole file, wired, before anything starts: a typo anywhere is an error now.
        run = load_run_config(config_path, args)
        if run.learner is None or run.actor is None or run.envserver is None:
            raise ValueError(f"{config_path}: a run needs [learner], [actor] and [envserver]")
        asked = run.actor.env.tool_format or run.envserver.tool_format  # the actor's wins
        if problem := demo_format_problem(asked, run.actor.engine.model, model_dir):
            raise ValueError(problem)
        gpus = gpu_wiring(run, local, visible_gpus())  # which GPU each process gets
        sections = read_sections(config_path, args + gpus.overrides)  # what every role runs
        auth, bus_env = bus_credentials()
    except ValueError as e:
        print(f"python -m deploy.local: {e}", file=sys.stderr)
        return 2

    metrics_ports = _prepare_run_dir(run_dir, local, ports, launched, own_rows)
    digest = freeze(run_dir, sections)
    _record_config(run_dir, digest, overrides if launched is None else None)
    if launched is None:
        print(f"resuming {run_dir.name}: every process on its directory, checkpoints and"
              " broker store", flush=True)  # fmt: skip
    print(gpus.summary, flush=True)
    supervisor = Supervisor(run_dir, policy=run.restarts)
    nats = NatsServer(
        run_dir / "nats",
        port=ports["nats"],
        log_file=run_dir / "logs" / "nats-server.log",
        auth=auth,
        tls=run.broker.tls,
    )

    stopping = stop_on_signals()
    follower = progress.RunFollower(run_dir, run.learner.total_steps)
    try:
        nats_env = auth.server_environment() if auth else None
        supervisor.start(
            Service("nats-server", nats.command(), env=nats_env, liveness_url=nats.health_url)
        )
        _wait_for(lambda: http_probe(nats.health_url, 1.0), 30.0, "nats-server")
        envs = {"learner": {**gpus.learner_env, **bus_env}, "actor": bus_env}
        frozen = frozen_path(run_dir)
        for service in _role_services(frozen, [], local.actor_replicas, ports, envs):
            supervisor.start(service)
        print(
            f"started nats-server ({nats.url}), envserver, learner, {local.actor_replicas} actor "
            f"replicas; logs in {supervisor.processes.log_dir}; metrics on ports {metrics_ports}",
            flush=True,
        )
        code = _follow(supervisor, follower, local.timeout_s, stopping.is_set)
    finally:
        supervisor.stop_all()
    if code == 0:
        progress.finish(run_dir, follower.records)
    return code


def _role_services(
    config_path: Path,
    args: list[str],
    num_replicas: int,
    ports: dict[str, int],
    envs: dict[str, dict[str, str]],
) -> list[Service]:
    """The envserver, learner and actor processes, with the same entry points as the
    `envserver`, `learner` and `actor` console scripts and their /healthz as liveness;
    `envs` adds to a role's environment (GPUs, bus credentials)."""
    cfg = ["--config", str(config_path)]
    python = [sys.executable, "-m"]

    def health(port: int) -> str:
        return f"http://127.0.0.1:{port}/healthz"

    return [
        Service(
            "envserver",
            [*python, "envservers.cli", *cfg, *args],
            liveness_url=health(ports["envserver"]),
        ),
        Service(
            "learner",
            [*python, "learner.cli", *cfg, *args],
            env=envs.get("learner"),
            finishes=True,
            liveness_url=health(ports["learner"]),
        ),
        Service(
            "actor",
            [*python, "actors.cli", *cfg, "--replicas", str(num_replicas), *args],
            env=envs.get("actor"),
        ),
    ]


def _wait_for(ready, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up within {timeout_s:.0f}s")
        time.sleep(0.05)


def _follow(supervisor, follower, timeout_s, stopping) -> int:
    """Print progress and keep the processes running until the learner reports that it is
    done; 0 on success, non-zero otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        supervisor.poll()
        for line in follower.poll():
            print(line, flush=True)
        # The done record is the end of the run's work; the process may take a while to
        # exit (and stops answering its probe meanwhile): it is not waited for.
        if supervisor.finished("learner") or follower.done:
            return 0
        failed = supervisor.given_up()
        if failed is not None:
            for line in follower.poll():  # the give-up's own line, with its reason
                print(line, flush=True)
            print(
                f"\n{failed.name} exited with code {failed.returncode} and is not restarted "
                f"(the line above says why); last log lines:\n{failed.log_tail()}",
                file=sys.stderr,
            )
            return 1
        if stopping():
            print("\ninterrupted: stopping every process", file=sys.stderr)
            return 130
        if time.monotonic() > deadline:
            print(f"\nrun did not finish within {timeout_s:.0f}s: stopping", file=sys.stderr)
            return 1
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local", description=__doc__)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument(
        "--resume",
        metavar="RUN",
        help="continue a stopped run: runs/<id>, or latest (its config and overrides again;"
        " overrides given now are added after them)",
    )
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(argv)
    return launch(args.config.resolve(), args.overrides, args.resume)


if __name__ == "__main__":
    sys.exit(main())
