"""User records (a CSV line, a JSONL object, a row of a saved Hugging Face dataset) as SkyRL
rows, by a column mapping (`learner prepare --column FIELD=COLUMN`, learner/sources.py):

    --column prompt=question --column ground_truth=answer [--column env_class=env]
    [--column data_source=...] [--column task_key=id] [--env-class NAME] [--system TEXT]

A text prompt becomes [system?, user]; a list of messages is used as is, with a system
message put first when `--system` is given and it has none (one of its own and `--system`
is an error: which one was meant?). Columns not mapped go to `extra_info`, where the
reward function sees them. Pure: the readers are in learner/sources.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.rows import Row, validate_row

FIELDS = ("prompt", "ground_truth", "env_class", "data_source", "task_key")


@dataclass(frozen=True)
class ColumnMap:
    """How a user's records become SkyRL rows."""

    columns: dict[str, str]
    """Row field -> the record's column: `prompt` and `ground_truth` always."""
    env_class: str | None = None
    """The env class of every row, unless a column gives it."""
    system: str | None = None
    """A system message put before each prompt that has none."""


def column_map(pairs: dict[str, str], *, env_class: str | None, system: str | None) -> ColumnMap:
    """The mapping of FIELD -> COLUMN pairs; ValueError for a field rows lack, prompt or
    ground_truth left unmapped, or no environment (rows cannot be scored without one)."""
    unknown = sorted(set(pairs) - set(FIELDS))
    if unknown:
        raise ValueError(f"--column {unknown[0]}: not a row field; map one of {list(FIELDS)}")
    for field in ("prompt", "ground_truth"):
        if field not in pairs:
            raise ValueError(f"--column: map {field} too (--column {field}=COLUMN)")
    if "env_class" in pairs and env_class is not None:
        raise ValueError("--env-class and --column env_class=...: give one")
    if "env_class" not in pairs and not env_class:
        raise ValueError(
            "mapped rows need an environment: --env-class NAME or --column env_class=COLUMN"
        )
    return ColumnMap(columns=dict(pairs), env_class=env_class, system=system)


def mapped_row(record: Any, cmap: ColumnMap, *, where: str, data_source: str) -> Row:
    """The SkyRL row of one record; ValueError naming `where`, the column and the field."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a record of columns, got {type(record).__name__}")
    values = {}
    for field, column in cmap.columns.items():
        if column not in record:
            raise ValueError(f"{where}: column {column!r} missing (mapped to {field})")
        values[field] = record[column]
    column = cmap.columns["prompt"]
    prompt = values["prompt"]
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError(f"{where}: column {column!r} is empty")
        prompt = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list):
        prompt = present_keys(prompt)
        first = prompt[0] if prompt and isinstance(prompt[0], dict) else {}
        if cmap.system and first.get("role") == "system":
            raise ValueError(
                f"{where}: column {column!r} has its own system message; --system is for "
                "prompts without one"
            )
    else:
        raise ValueError(
            f"{where}: column {column!r}: expected text or a list of messages, "
            f"got {type(prompt).__name__}"
        )
    if cmap.system:
        prompt = [{"role": "system", "content": cmap.system}, *prompt]
    mapped = set(cmap.columns.values())
    extra_info = {key: value for key, value in record.items() if key not in mapped}
    if "task_key" in values:
        extra_info["task_key"] = str(values["task_key"])
    row = {
        "data_source": values.get("data_source", data_source),
        "env_class": values.get("env_class", cmap.env_class),
        "prompt": prompt,
        "reward_spec": {"ground_truth": values["ground_truth"]},
        "extra_info": extra_info,
    }
    return validate_row(row, where=where)


def present_keys(messages: list[Any]) -> list[Any]:
    """Messages without the keys Arrow filled with None (`name` on messages that had none)."""
    return [
        {k: v for k, v in m.items() if v is not None or k in ("role", "content")}
        if isinstance(m, dict)
        else m
        for m in messages
    ]
