"""`learner --config C [section.key=value ...]`: validate the config, then run the learner.

The config is checked before torch is imported, so `--help` and a bad config answer at once.
`--nproc N` (or `learner.nproc`) > 1 re-launches this command under torchrun with N ranks.
`learner prepare ...` makes train/eval splits of a SkyRL-format dataset.
`learner merge-adapter --checkpoint DIR --out DIR` merges a LoRA run's adapter into its base
model (learner/trainer/merge_adapter.py).
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="learner", description="Tether learner: trains on trajectories from the bus."
    )
    parser.add_argument("--config", required=True, help="TOML or YAML config file")
    parser.add_argument("--nproc", type=int, default=None, help="learner ranks (FSDP2)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides: learner.optim.lr=1e-5")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["prepare"]:
        from learner.data import prepare_main

        return prepare_main(argv[1:])
    if argv[:1] == ["merge-adapter"]:
        from learner.trainer.merge_adapter import merge_main

        return merge_main(argv[1:])
    args = parse_args(argv)
    overrides = list(args.overrides)
    if args.nproc is not None:
        overrides.append(f"learner.nproc={args.nproc}")
    from broker.config import BrokerConfig
    from common.config import load_section
    from common.storage_config import StorageConfig
    from learner.config import LearnerConfig

    try:
        config = load_section(LearnerConfig, args.config, "learner", overrides)
        load_section(BrokerConfig, args.config, "broker", overrides)
        load_section(StorageConfig, args.config, "storage", overrides)
    except ValueError as e:
        print(f"learner: {e}", file=sys.stderr)
        return 2
    if config.train_data is None:
        print("learner: learner.train_data is required (a SkyRL-format JSONL)", file=sys.stderr)
        return 2
    if config.nproc > 1 and "LOCAL_RANK" not in os.environ:
        return _relaunch_under_torchrun(config.nproc, args.config, overrides)
    from learner.main import run

    return run(args.config, overrides)


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
