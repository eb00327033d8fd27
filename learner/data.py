"""SkyRL-format prompt datasets: load and validate rows, and make train/eval splits.

A row is `{"data_source", "env_class", "prompt", "reward_spec", "extra_info"}`; `prompt` is
the system message (optional) and the first user message only; `reward_spec` holds at least
`ground_truth`. Files are JSONL (one row per line) or Parquet (SkyRL's usual format; needs
`pyarrow`, otherwise only JSONL is read and a Parquet path fails with a clear message). A bad
row fails loading with the file, the line (JSONL) or row number (Parquet, 1-based) and the
field (common/rows.py checks every field). Extra keys of a row are kept as they are.

Splits follow the seeds' `prepare_dataset.py`: a task goes to eval when the MD5 of its task
key (`extra_info.task_key`, else a hash of env_class + prompt) falls below the eval
fraction, so the same task lands in the same split on every run; stratified per
environment (each one keeps the ratio); an environment expecting fewer than
`min_eval_per_env` eval rows goes entirely to train; held-out environments go entirely to
eval. `learner prepare` (learner/prepare.py) makes a dataset's splits with them.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from common.rows import Row, validate_row

try:
    import pyarrow
    import pyarrow.parquet
except ImportError:  # Parquet support is optional; JSONL always works.
    pyarrow = None


def read_raw(path: Path) -> list[tuple[str, Any]]:
    """(where, row) of every row: `path:LINE` for JSONL, `path:row N` for Parquet."""
    if path.suffix == ".parquet":
        return _read_parquet(path)
    if path.suffix not in (".jsonl", ".json"):
        raise ValueError(f"{path}: dataset files must end in .jsonl or .parquet")
    rows = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{number}: not UTF-8 text: {e}") from None
            if not line.strip():
                continue
            try:
                rows.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not valid JSON: {e}") from None
    return rows


def _read_parquet(path: Path) -> list[tuple[str, Any]]:
    if pyarrow is None:
        raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)")
    try:
        table = pyarrow.parquet.read_table(path)
    except (pyarrow.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a readable Parquet file: {e}") from None
    return [(f"{path}:row {n}", row) for n, row in enumerate(table.to_pylist(), start=1)]


def load_dataset(path: str | Path) -> list[Row]:
    """All rows of one JSONL or Parquet file, validated; ValueError names the file, the line
    (JSONL) or row (Parquet, 1-based) and the field."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"dataset {path} does not exist")
    rows = [validate_row(row, where=where) for where, row in read_raw(path)]
    if not rows:
        raise ValueError(f"dataset {path} holds no rows")
    return rows


def task_key(row: Row) -> str:
    """`extra_info.task_key`, else a stable hash of the environment and the prompt."""
    key = row.get("extra_info", {}).get("task_key")
    if key:
        return str(key)
    canonical = json.dumps([row["env_class"], row["prompt"]], sort_keys=True)
    return "prompt-" + hashlib.md5(canonical.encode()).hexdigest()


def hash_fraction(key: str) -> float:
    """A stable number in [0, 1) from the MD5 of `key` (same rule as demo.data)."""
    return int(hashlib.md5(key.encode()).hexdigest()[:8], 16) / 0x1_0000_0000


def split_rows(
    rows: list[Row],
    *,
    eval_fraction: float = 0.02,
    min_eval_per_env: int = 5,
    held_out_envs: tuple[str, ...] | list[str] = (),
    env_field: str = "env_class",
) -> tuple[list[Row], list[Row]]:
    """(train, eval) rows, each in input order; see the module docstring for the rules."""
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    if env_field not in ("env_class", "data_source"):
        raise ValueError(f"env_field must be env_class or data_source, got {env_field!r}")
    env_sizes = Counter(row[env_field] for row in rows)
    train, eval_ = [], []
    for row in rows:
        env = row[env_field]
        if env in held_out_envs:
            eval_.append(row)
        elif env_sizes[env] * eval_fraction < min_eval_per_env:
            train.append(row)
        elif hash_fraction(task_key(row)) < eval_fraction:
            eval_.append(row)
        else:
            train.append(row)
    return train, eval_


def write_dataset(rows: list[Row], path: str | Path) -> None:
    """Write rows as JSONL, or Parquet when the path ends in .parquet."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        if pyarrow is None:
            raise ValueError(f"{path}: writing Parquet needs pyarrow (pip install pyarrow)")
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
        return
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
