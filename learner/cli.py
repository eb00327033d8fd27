"""`learner --config C [section.key=value ...]`: validate the config, then run the learner.

The config, the model directories, the datasets (every row) and the metrics port are
checked before torch, the broker or W&B, so `--help` and what cannot heal answer at once
(one line, exit code 2; docs/running.md).
`--nproc N` (or `learner.nproc`) > 1 re-launches this command under torchrun with N ranks.
`--fresh` starts a new run instead of resuming `learner.checkpoint.dir` (learner/fresh.py).
`learner prepare ...` makes train/eval splits of a SkyRL-format dataset.
`learner merge-adapter --checkpoint DIR --out DIR` merges a LoRA run's adapter into its base
model (learner/trainer/merge_adapter.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common.supervision import EXIT_CONFIG, EXIT_UNREACHABLE


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="learner", description="Tether learner: trains on trajectories from the bus."
    )
    parser.add_argument("--config", required=True, help="TOML or YAML config file")
    parser.add_argument("--nproc", type=int, default=None, help="learner ranks (FSDP2)")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start a new run: resume nothing, move learner.checkpoint.dir aside",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides: learner.optim.lr=1e-5")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["prepare"]:
        from learner.prepare import prepare_main

        return prepare_main(argv[1:])
    if argv[:1] == ["merge-adapter"]:
        from learner.trainer.merge_adapter import merge_main

        return merge_main(argv[1:])
    args = parse_args(argv)
    overrides = list(args.overrides)
    if args.nproc is not None:
        overrides.append(f"learner.nproc={args.nproc}")
    if args.fresh:  # learner/fresh.py
        overrides.append("learner.checkpoint.resume=false")
    from broker.config import BrokerConfig
    from common.config import load_section
    from common.storage_config import StorageConfig
    from learner.config import LearnerConfig

    try:
        config = load_section(LearnerConfig, args.config, "learner", overrides)
        broker = load_section(BrokerConfig, args.config, "broker", overrides)
        storage = load_section(StorageConfig, args.config, "storage", overrides)
    except ValueError as e:
        print(f"learner: {e}", file=sys.stderr)
        return 2
    if config.train_data is None:
        print("learner: learner.train_data is required (a SkyRL-format JSONL)", file=sys.stderr)
        return 2
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # once per machine: who binds the port
        problem = preflight(config)
        if problem:
            print(f"learner: {problem}", file=sys.stderr)
            return EXIT_CONFIG
    if args.fresh and "LOCAL_RANK" not in os.environ:
        from learner.fresh import bucket_problem, set_aside

        if problem := bucket_problem(storage, broker.namespace):
            print(f"learner {problem}", file=sys.stderr)
            return EXIT_CONFIG
        if moved := set_aside(config.checkpoint.dir):
            print(f"learner --fresh: moved {config.checkpoint.dir} aside to {moved}", flush=True)
    if config.nproc > 1 and "LOCAL_RANK" not in os.environ:
        return _relaunch_under_torchrun(config.nproc, args.config, overrides)
    return _run(args.config, overrides)


def preflight(config) -> str | None:
    """What keeps this learner from starting, found before torch, the broker or W&B: a model
    directory that is not there, a dataset row that is wrong (`file:line: field: reason`),
    the metrics port taken. None when all is well."""
    from common.metrics import PortInUse, require_free_port
    from common.model_paths import model_dir_problem
    from learner.data import load_dataset

    for key, value in (
        ("learner.model_path", config.model_path),
        ("learner.ref_model_path", config.ref_model_path),
    ):
        if value and (problem := model_dir_problem(value, key=key)):
            return problem
    for key, path in (
        ("learner.train_data", config.train_data),
        ("learner.eval_data", config.eval_data),
    ):
        if path is None:
            continue
        if not Path(path).is_file():
            return f"{key}: dataset {path} does not exist"
        try:
            load_dataset(path)  # validates every row; the loop loads it again (cheap next to a run)
        except ValueError as e:
            return str(e)
    if problem := algorithm_plugin_problem(config.algorithm):
        return problem
    try:
        require_free_port(config.metrics_port, config.metrics_host, setting="learner.metrics_port")
    except PortInUse as e:
        return str(e)
    return None


def algorithm_plugin_problem(algorithm) -> str | None:
    """A user's advantage estimator or policy loss (an import path) that cannot be loaded,
    as one line; None when both are built-ins or load."""
    from common.plugins import PluginError, import_object
    from learner.trainer.config import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

    for key, name, builtins in (
        ("advantage_estimator", algorithm.advantage_estimator, ADVANTAGE_ESTIMATORS),
        ("policy_loss", algorithm.policy_loss, POLICY_LOSSES),
    ):
        if name in builtins:
            continue
        try:
            target = import_object(name)
        except PluginError as e:
            return f"learner.algorithm.{key}: {e}"
        if not callable(target):
            return f"learner.algorithm.{key}: {name} is a {type(target).__name__}, not a function"
    return None


def _run(config_path: str, overrides: list[str]) -> int:
    """learner.main.run, with what cannot heal (a port taken meanwhile, credentials refused,
    a broker store full of runs that are not done) and a broker that never answered as one
    line and an exit code instead of a traceback."""
    from broker.connection import BrokerUnreachable
    from broker.runs import StoreFull
    from broker.security import BrokerRefused
    from common.metrics import PortInUse
    from learner.main import run

    try:
        return run(config_path, overrides)
    except (PortInUse, BrokerRefused, StoreFull) as e:
        print(f"learner: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except BrokerUnreachable as e:
        print(f"learner: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE


def _relaunch_under_torchrun(nproc: int, config: str, overrides: list[str]) -> int:
    import subprocess

    from common.procs import free_port

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "-m",
        "learner.cli",
        "--config",
        config,
        *overrides,
    ]
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
