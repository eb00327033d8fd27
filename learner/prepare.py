"""`learner prepare`: rows from files or a source (learner/sources.py), split into train and
eval (learner/data.py), written to `--output-dir`, with a count per environment.

    learner prepare INPUTS... --output-dir D        (python -m learner.prepare, the same)

`run_prepare` is the subcommand's body; `add_prepare_arguments` adds its flags to a parser.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from learner import sources
from learner.data import split_rows, write_dataset


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    sources.add_source_arguments(parser)  # inputs, --from, --column, ... (learner/sources.py)
    parser.add_argument("--output-dir", required=True, help="where train.* and eval.* go")
    parser.add_argument("--eval-fraction", type=float, default=0.02)
    parser.add_argument(
        "--min-eval-per-env",
        type=int,
        default=5,
        help="an environment expecting fewer eval rows than this goes entirely to train",
    )
    parser.add_argument(
        "--held-out", nargs="*", default=[], help="environments that go entirely to eval"
    )
    parser.add_argument("--env-field", choices=("env_class", "data_source"), default="env_class")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")


def run_prepare(args: argparse.Namespace) -> int:
    """Load, split, write `train.<format>` and `eval.<format>`, print counts per env."""
    rows = sources.prepare_rows(args)
    train, eval_ = split_rows(
        rows,
        eval_fraction=args.eval_fraction,
        min_eval_per_env=args.min_eval_per_env,
        held_out_envs=tuple(args.held_out),
        env_field=args.env_field,
    )
    out = Path(args.output_dir)
    write_dataset(train, out / f"train.{args.format}")
    write_dataset(eval_, out / f"eval.{args.format}")
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for split, split_rows_ in ((0, train), (1, eval_)):
        for row in split_rows_:
            counts[row[args.env_field]][split] += 1
    width = max([24, *(len(env) + 2 for env in counts)])  # reasoning_gym:TASK names are long
    print(f"{'environment':<{width}}{'train':>8}{'eval':>8}")
    for env in sorted(counts):
        print(f"{env:<{width}}{counts[env][0]:>8}{counts[env][1]:>8}")
    print(f"{'total':<{width}}{len(train):>8}{len(eval_):>8}")
    return 0


def prepare_main(argv: list[str] | None = None) -> int:
    """`python -m learner.prepare ...`: the prepare subcommand on its own."""
    parser = argparse.ArgumentParser(prog="learner prepare", description=__doc__.splitlines()[0])
    add_prepare_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_prepare(args)
    except ValueError as e:  # a bad input file, row, column or source: one line, nothing written
        print(f"learner prepare: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(prepare_main())
