"""Inputs a demo run on a cluster makes for itself: the tiny model and the calculator
dataset. The `dev` overlay's init containers run it before the learner and the actors start;
a real run brings its own model and data instead (docs/deploy.md).

    python -m deploy.prepare --config C {model,data}... [section.key=value ...]

`model` points `prepare.model_dir` at the tiny model with a relative symlink, swapped
atomically: the warm-started model shipped in the repository, or a random-weight build
(cached by recipe hash and locked, so pods preparing at once build it once). `data` writes
`train.jsonl` and `eval.jsonl` into `prepare.data_dir` (seeded: the same rows every time).
The settings are the `[prepare]` section of the run's config file.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pydantic

from common.config import StrictModel, load_section


class PrepareConfig(StrictModel):
    """The `[prepare]` section: what the init containers make, and where."""

    model_dir: str = "/inputs/models/tiny"
    """Path at which the model appears (a symlink into `cache_dir`); the learner's
    model_path and the actors' engine.model point here."""
    cache_dir: str = ""
    """Cache root of tiny model builds; empty: $TETHER_CACHE/tinymodel."""
    warm_start: bool = True
    """The shipped supervised warm start, or random weights (a build of seconds)."""
    data_dir: str = "/inputs/data"
    """Directory of train.jsonl and eval.jsonl (the learner's train_data and eval_data)."""
    num_train_rows: int = pydantic.Field(10_000, ge=1)
    """Training prompts."""
    num_eval_rows: int = pydantic.Field(100, ge=1)
    """Held-out eval prompts."""
    dataset_seed: int = 0
    """Seed of the training prompts."""


def point_symlink(link: Path, target: Path) -> None:
    """Make `link` a relative symlink to `target`, replacing any old one atomically."""
    link.parent.mkdir(parents=True, exist_ok=True)
    relative = os.path.relpath(target, link.parent)
    scratch = link.parent / f".{link.name}.{os.getpid()}"
    scratch.unlink(missing_ok=True)
    scratch.symlink_to(relative)
    os.replace(scratch, link)


def prepare_model(config: PrepareConfig) -> Path:
    from demo.tinymodel import build_random_tiny_model, shipped_model_dir

    if config.warm_start:
        built = shipped_model_dir()  # shipped in the image with the repository
    else:
        built = build_random_tiny_model(config.cache_dir or None)
    point_symlink(Path(config.model_dir), built.resolve())
    return built.resolve()


def prepare_data(config: PrepareConfig) -> tuple[Path, Path]:
    from demo.data import write_dataset

    return write_dataset(
        config.data_dir,
        num_train=config.num_train_rows,
        num_eval=config.num_eval_rows,
        seed=config.dataset_seed,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.prepare", description=__doc__)
    parser.add_argument("--config", required=True, help="the run's config file")
    parser.add_argument("what", nargs="+", help="model, data, or both")
    args = parser.parse_args(argv)
    what = [w for w in args.what if "=" not in w]
    overrides = [w for w in args.what if "=" in w]
    unknown = set(what) - {"model", "data"}
    if unknown or not what:
        parser.error(f"say what to prepare: model and/or data (got {sorted(unknown) or what})")
    try:
        config = load_section(PrepareConfig, args.config, "prepare", overrides)
    except ValueError as e:
        print(f"prepare: {e}", file=sys.stderr)
        return 2
    if "model" in what:
        built = prepare_model(config)
        print(f"model: {config.model_dir} -> {built}", flush=True)
    if "data" in what:
        train, evals = prepare_data(config)
        print(f"data: {train} ({config.num_train_rows} rows), {evals}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
