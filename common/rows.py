"""The SkyRL dataset row, validated in one place for every role: the learner loading a
dataset, the actor receiving a prompt task, the env server resetting a session.

    {"data_source": str, "env_class": str, "prompt": [system,] user (first user message
     only), "reward_spec": {"ground_truth": ..., ...}, "extra_info": {...} (optional)}

Every field a row carries to the actors and env servers is checked: a prompt message is an
object of strings (`role`, `content`, optionally `name`); `reward_spec` and `extra_info` are
JSON data all the way down (str, finite number, 64-bit integer, bool, null, list, object with
string keys), because they travel as MessagePack to the actors and as JSON to the env
servers. A Parquet file can hold what JSON cannot (timestamps, decimals, bytes, maps); such a
value is refused here, naming its path, instead of failing a long-running actor later. Other
top-level keys of a row stay with the row and travel nowhere.

Problems are reported as "field: reason" so the caller can say where (file and line, task
id) in front of it.
"""

from __future__ import annotations

import math
from typing import Any

Row = dict[str, Any]
PROMPT_ROLES = ("system", "user")
_INT_RANGE = (-(2**63), 2**64 - 1)  # what MessagePack can carry


def json_problem(value: Any, *, field: str) -> str | None:
    """What keeps `value` from being JSON data (naming the path inside it), or None."""
    if value is None or isinstance(value, bool | str):
        return None
    if isinstance(value, int):
        if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
            return f"{field}: integer {value} does not fit in 64 bits"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{field}: {value} is not a finite number"
    if isinstance(value, list):
        for k, item in enumerate(value):
            if (problem := json_problem(item, field=f"{field}[{k}]")) is not None:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{field}: key {key!r} is not a string"
            if (problem := json_problem(item, field=f"{field}.{key}")) is not None:
                return problem
        return None
    return (
        f"{field}: expected JSON data (string, number, bool, null, list, object), "
        f"got {type(value).__name__} {_short(value)}"
    )


def messages_problem(messages: Any, *, field: str = "prompt") -> str | None:
    """What is wrong with a list of chat messages ({"role": str, "content": str, ...}, every
    value a string), or None."""
    if not isinstance(messages, list) or not messages:
        return f"{field}: expected a non-empty list of messages"
    for k, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"{field}[{k}]: expected {{'role': str, 'content': str}}, got {message!r}"
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                return f"{field}[{k}].{key}: expected a string, got {_short(message.get(key))}"
        for key, value in message.items():
            if not isinstance(key, str) or not isinstance(value, str):
                return f"{field}[{k}].{key}: expected a string, got {_short(value)}"
    return None


def row_problem(row: Any) -> str | None:
    """What is wrong with a SkyRL row (as 'field: reason'), or None."""
    if not isinstance(row, dict):
        return f"row: expected an object, got {type(row).__name__}"
    for name in ("data_source", "env_class"):
        if not isinstance(row.get(name), str):
            return f"{name}: expected a string, got {_short(row.get(name))}"
    if not row["env_class"]:
        return "env_class: must not be empty"
    prompt = row.get("prompt")
    problem = messages_problem(prompt)
    if problem is not None:
        return problem
    for k, message in enumerate(prompt):
        if message["role"] not in PROMPT_ROLES:
            return f"prompt[{k}].role: expected 'system' or 'user', got {message['role']!r}"
    roles = [m["role"] for m in prompt]
    if roles not in (["user"], ["system", "user"]):
        return f"prompt: must be [system,] user (first user message only), got roles {roles}"
    reward_spec = row.get("reward_spec")
    if not isinstance(reward_spec, dict) or "ground_truth" not in reward_spec:
        return f"reward_spec: expected an object with 'ground_truth', got {_short(reward_spec)}"
    if not isinstance(row.get("extra_info", {}), dict | None):
        return f"extra_info: expected an object, got {_short(row.get('extra_info'))}"
    for name in ("reward_spec", "extra_info"):
        if (problem := json_problem(row.get(name), field=name)) is not None:
            return problem
    return None


def validate_row(row: Any, *, where: str) -> Row:
    """The row with `extra_info` defaulted to {}; ValueError naming `where` and the field."""
    problem = row_problem(row)
    if problem:
        raise ValueError(f"{where}: {problem}")
    return {**row, "extra_info": row.get("extra_info") or {}}


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
