"""Where `learner prepare` gets rows, besides the SkyRL JSONL/Parquet files it always read:

    learner prepare FILES_OR_DIRS --column prompt=question --column ground_truth=answer
                    [--column env_class=COL] [--env-class NAME] [--system TEXT] [--split S]
    learner prepare --from reasoning_gym:TASK --size N [--seed S] [--task-config KEY=VALUE]
    learner prepare --from verifiers:MODULE   --size N [--seed S] [--task-config KEY=VALUE]
    learner prepare --from pkg.mod:fn | NAME  --size N [--seed S] [--task-config KEY=VALUE]

Datasets as users hold them: JSONL, Parquet or CSV files, or a directory Hugging Face
`datasets` saved (`save_to_disk`; a DatasetDict gives its `--split`), whose columns a mapping
turns into rows (learner/columns.py). Without a mapping, inputs are SkyRL rows, read exactly
as before (learner/data.py); a saved dataset's prompts lose the keys Arrow filled with None.

`--from` makes rows: a reasoning-gym task (common/reasoning_gym_tasks.py), a `verifiers`
environment's dataset (common/verifiers_envs.py: `--task-config` is its load_environment's
keyword arguments, the same as the env server's plug-in settings), or the user's
function `fn(size=N, seed=S, **task_config)` returning an iterable of SkyRL rows, by import
path or `tether.datasets` entry point (common/plugins.py). Every row is validated
(common/rows.py); an error names the file or source, the row and the field. `datasets` and
reasoning-gym are imported only when used, so `learner prepare --help` stays fast.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from common import plugins
from common.rows import Row, validate_row
from learner.columns import FIELDS, ColumnMap, column_map, mapped_row, present_keys
from learner.data import load_dataset, read_raw

REASONING_GYM = "reasoning_gym:"
VERIFIERS = "verifiers:"


def parse_pairs(items: list[str], *, flag: str) -> dict[str, str]:
    """{"KEY": "VALUE"} from ["KEY=VALUE", ...]; ValueError naming the flag."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{flag} {item!r}: write KEY=VALUE")
        if key in pairs:
            raise ValueError(f"{flag} {key}: given twice")
        pairs[key] = value
    return pairs


def parse_task_config(items: list[str]) -> dict[str, Any]:
    """--task-config values as JSON where they parse (`max_digits=3`, `ops=["+","-"]`), else
    as text (`style=simple`)."""
    config: dict[str, Any] = {}
    for key, text in parse_pairs(items, flag="--task-config").items():
        try:
            config[key] = json.loads(text)
        except json.JSONDecodeError:
            config[key] = text
    return config


def read_records(path: Path, *, split: str = "train") -> list[tuple[str, Any]]:
    """(where, record) of every record of a file or a saved Hugging Face dataset."""
    if path.is_dir():
        return _read_saved(path, split)
    if not path.is_file():
        raise ValueError(f"dataset {path} does not exist")
    if path.suffix == ".csv":
        return _read_csv(path)
    if path.suffix in (".jsonl", ".json", ".parquet"):
        return read_raw(path)
    raise ValueError(
        f"{path}: dataset inputs are .jsonl, .parquet or .csv files, or directories saved by "
        "Hugging Face datasets (save_to_disk)"
    )


def _read_csv(path: Path) -> list[tuple[str, Any]]:
    records = []
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            for number, record in enumerate(reader, start=1):
                where = f"{path}:row {number}"
                if None in record:
                    raise ValueError(f"{where}: more cells than the header has columns")
                if None in record.values():
                    raise ValueError(f"{where}: fewer cells than the header has columns")
                records.append((where, record))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text: {e}") from None
    except csv.Error as e:
        raise ValueError(f"{path}: not readable as CSV: {e}") from None
    return records


def _read_saved(path: Path, split: str) -> list[tuple[str, Any]]:
    if importlib.util.find_spec("datasets") is None:
        raise ValueError(f"{path}: reading a saved dataset needs `datasets` (pip install datasets)")
    import datasets

    try:
        saved = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise ValueError(
            f"{path}: a directory, but not a dataset saved by Hugging Face datasets (save_to_disk)"
        ) from None
    label = str(path)
    if isinstance(saved, datasets.DatasetDict):
        if split not in saved:
            raise ValueError(f"{path}: no split {split!r} (it has {sorted(saved)}); use --split")
        saved, label = saved[split], f"{path}[{split}]"
    return [(f"{label}:row {number}", record) for number, record in enumerate(saved, start=1)]


def input_rows(path: str | Path, cmap: ColumnMap | None, *, split: str = "train") -> list[Row]:
    """The rows of one input: its records mapped by `cmap`, or SkyRL rows without one."""
    path = Path(path)
    if cmap is None and path.suffix == ".csv":
        raise ValueError(
            f"{path}: a CSV file holds columns, not SkyRL rows: map them with "
            "--column prompt=COLUMN --column ground_truth=COLUMN"
        )
    if cmap is None and not path.is_dir():
        return load_dataset(path)  # SkyRL rows in JSONL or Parquet, as always
    records = read_records(path, split=split)
    if not records:
        raise ValueError(f"dataset {path} holds no rows")
    if cmap is None:  # SkyRL rows saved by Hugging Face datasets
        return [validate_row(_saved_row(record), where=where) for where, record in records]
    return [mapped_row(rec, cmap, where=where, data_source=path.stem) for where, rec in records]


def _saved_row(record: Any) -> Any:
    if isinstance(record, dict) and isinstance(record.get("prompt"), list):
        return {**record, "prompt": present_keys(record["prompt"])}
    return record


def source_rows(
    spec: str,
    *,
    size: int,
    seed: int,
    config: dict[str, Any],
    system: str | None = None,
    env_class: str | None = None,
) -> list[Row]:
    """The rows `--from spec` makes, validated; ValueError naming the source and row."""
    if spec.startswith(REASONING_GYM):
        if importlib.util.find_spec("reasoning_gym") is None:
            raise ValueError(f"--from {spec}: needs reasoning-gym (pip install reasoning-gym)")
        from common import reasoning_gym_tasks

        made: Iterable[Any] = reasoning_gym_tasks.make_rows(
            spec.removeprefix(REASONING_GYM),
            size=size,
            seed=seed,
            config=config,
            system=reasoning_gym_tasks.SYSTEM_PROMPT if system is None else system,
            env_class=env_class,
        )
    elif spec.startswith(VERIFIERS):
        if system is not None:
            raise ValueError(
                f"--from {spec}: --system does not apply: the environment writes its prompts"
            )
        from common import verifiers_envs

        made = verifiers_envs.make_rows(
            spec.removeprefix(VERIFIERS), size=size, seed=seed, settings=config,
            env_class=env_class,
        )  # fmt: skip
    else:
        if system is not None or env_class is not None:
            raise ValueError(
                f"--from {spec}: --system and --env-class apply to reasoning_gym tasks and "
                "mapped columns; a dataset source returns whole rows"
            )
        make = plugins.load(spec, "tether.datasets")
        made = plugins.call(spec, make, size=size, seed=seed, **config)
        if isinstance(made, dict | str | bytes) or not isinstance(made, Iterable):
            raise ValueError(
                f"--from {spec}: returned a {type(made).__name__}; a dataset source returns "
                "an iterable of SkyRL rows"
            )
        made = plugins.call(spec, list, made)  # a generator runs the user's code here
    rows = [validate_row(row, where=f"{spec}: row {n}") for n, row in enumerate(made, start=1)]
    if not rows:
        raise ValueError(f"--from {spec}: made no rows")
    return rows


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="*",
        help="JSONL, Parquet or CSV files, or directories saved by Hugging Face datasets",
    )
    parser.add_argument(
        "--from",
        dest="source",
        metavar="SOURCE",
        help="make rows: reasoning_gym:TASK, verifiers:MODULE, or a function "
        "pkg.mod:fn(size, seed, **config) "
        "or tether.datasets entry point returning SkyRL rows",
    )
    parser.add_argument("--size", type=int, help="rows to make (--from)")
    parser.add_argument("--seed", type=int, help="seed of the rows made (--from; default 0)")
    parser.add_argument(
        "--task-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the task (--from), VALUE as JSON where it parses",
    )
    parser.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="FIELD=COLUMN",
        help=f"map an input column to a row field ({', '.join(FIELDS)})",
    )
    parser.add_argument("--env-class", help="env_class of mapped or reasoning_gym rows")
    parser.add_argument("--system", help="system message of mapped or reasoning_gym rows")
    parser.add_argument("--split", default="train", help="split of a saved DatasetDict")


def prepare_rows(args: argparse.Namespace) -> list[Row]:
    """Every row the command line names: its inputs, then what `--from` makes."""
    if not args.inputs and not args.source:
        raise ValueError("give dataset files or directories, or --from SOURCE")
    if args.source and args.size is None:
        raise ValueError("--from needs --size N (how many rows to make)")
    if not args.source and (args.size is not None or args.seed is not None or args.task_config):
        raise ValueError("--size, --seed and --task-config go with --from")
    if args.column and not args.inputs:
        raise ValueError("--column maps the columns of input files; give files or directories")
    gym = bool(args.source and args.source.startswith(REASONING_GYM))
    verifiers = bool(args.source and args.source.startswith(VERIFIERS))
    if args.system is not None and not (args.column or gym):
        raise ValueError("--system goes with --column or --from reasoning_gym:TASK")
    if args.env_class is not None and not (args.column or gym or verifiers):
        raise ValueError(
            "--env-class goes with --column or --from reasoning_gym:TASK or verifiers:MODULE"
        )
    cmap = None
    if args.column:
        pairs = parse_pairs(args.column, flag="--column")
        cmap = column_map(pairs, env_class=args.env_class, system=args.system)
    rows = [row for path in args.inputs for row in input_rows(path, cmap, split=args.split)]
    if args.source:
        rows += source_rows(
            args.source,
            size=args.size,
            seed=0 if args.seed is None else args.seed,
            config=parse_task_config(args.task_config),
            system=args.system if gym else None,
            env_class=args.env_class if gym or verifiers else None,
        )
    return rows
