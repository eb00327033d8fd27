"""`actor --config C --replicas N [section.key=value ...]`: start N actor replicas.

The config ([actor], [broker], [storage] and [restarts] sections), the model directory and
the replicas' metrics ports are checked before torch or vLLM is imported, so `--help`, a bad
config, a wrong path and a taken port answer at once (one line, exit code 2;
docs/running.md). Each replica is a
local process with its own vLLM engine (actors/replicas.py); this process supervises them
and passes SIGTERM on.
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="actor",
        description="Tether rollout actors: vLLM replicas that turn prompts into trajectories.",
    )
    parser.add_argument("--config", required=True, help="TOML or YAML config file")
    parser.add_argument(
        "--replicas", type=int, default=1, help="actor replicas to run, each with its own engine"
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted overrides: actor.rollout.max_turns=4",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replicas < 1:
        print(f"actor: --replicas must be >= 1, got {args.replicas}", file=sys.stderr)
        return 2
    from actors.config import ActorConfig
    from broker.config import BrokerConfig
    from common.config import load_section
    from common.storage_config import StorageConfig
    from common.supervision import RestartPolicy

    try:
        config = load_section(ActorConfig, args.config, "actor", args.overrides)
        load_section(BrokerConfig, args.config, "broker", args.overrides)
        load_section(StorageConfig, args.config, "storage", args.overrides)
        restarts = load_section(RestartPolicy, args.config, "restarts", args.overrides)
    except ValueError as e:
        print(f"actor: {e}", file=sys.stderr)
        return 2
    problem = preflight(config, args.replicas)
    if problem:
        print(f"actor: {problem}", file=sys.stderr)
        return 2

    import logging
    import signal

    from actors.replicas import LocalProcesses, ReplicaSpec, replica_gpus, supervise
    from common.placement import visible_gpus

    try:
        devices = replica_gpus(
            config.replica_gpus, args.replicas, config.engine.num_gpus, visible_gpus()
        )
    except ValueError as e:
        print(f"actor: {e}", file=sys.stderr)
        return 2
    if config.engine.device == "cuda":  # before any replica starts an engine
        from common.cuda_driver import CudaUnavailable, require_cuda

        try:
            require_cuda("actor.engine.device")
        except CudaUnavailable as e:
            print(f"actor: {e}", file=sys.stderr)
            return 1

    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s actor %(name)s: %(message)s"
    )
    stopping = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.append(True))
    specs = [
        ReplicaSpec(
            index=i,
            config_path=args.config,
            overrides=tuple(args.overrides),
            cuda_visible_devices=devices[i],
        )
        for i in range(args.replicas)
    ]
    return supervise(LocalProcesses(), specs, should_stop=lambda: bool(stopping), policy=restarts)


def preflight(config, num_replicas: int) -> str | None:
    """What keeps the replicas from starting, found before any is spawned: a model directory
    that is not there, a metrics port taken. None when all is well."""
    from actors.replicas import replica_metrics_port
    from common.metrics import PortInUse, require_free_port
    from common.model_paths import model_dir_problem

    problem = model_dir_problem(config.engine.model, key="actor.engine.model")
    if problem:
        return problem
    for i in range(num_replicas):
        port, setting = replica_metrics_port(config.metrics_port, i)
        try:
            require_free_port(port, config.metrics_host, setting=setting)
        except PortInUse as e:
            return str(e)
    return None


if __name__ == "__main__":
    sys.exit(main())
