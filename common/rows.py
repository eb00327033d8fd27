"""The SkyRL dataset row, validated in one place for every role: the learner loading a
dataset, the actor receiving a prompt task, the env server resetting a session.

    {"data_source": str, "env_class": str, "prompt": [system,] user (first user message
     only), "reward_spec": {"ground_truth": ..., ...}, "extra_info": {...} (optional)}

Problems are reported as "field: reason" so the caller can say where (file and line, task
id) in front of it.
"""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]
PROMPT_ROLES = ("system", "user")


def messages_problem(messages: Any, *, field: str = "prompt") -> str | None:
    """What is wrong with a list of chat messages ({"role": str, "content": str}), or None."""
    if not isinstance(messages, list) or not messages:
        return f"{field}: expected a non-empty list of messages"
    for k, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"{field}[{k}]: expected {{'role': str, 'content': str}}, got {message!r}"
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                return f"{field}[{k}].{key}: expected a string, got {message.get(key)!r}"
    return None


def row_problem(row: Any) -> str | None:
    """What is wrong with a SkyRL row (as 'field: reason'), or None."""
    if not isinstance(row, dict):
        return f"row: expected an object, got {type(row).__name__}"
    for name in ("data_source", "env_class"):
        if not isinstance(row.get(name), str):
            return f"{name}: expected a string, got {row.get(name)!r}"
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
        return f"reward_spec: expected an object with 'ground_truth', got {reward_spec!r}"
    if not isinstance(row.get("extra_info", {}), dict | None):
        return f"extra_info: expected an object, got {row.get('extra_info')!r}"
    return None


def validate_row(row: Any, *, where: str) -> Row:
    """The row with `extra_info` defaulted to {}; ValueError naming `where` and the field."""
    problem = row_problem(row)
    if problem:
        raise ValueError(f"{where}: {problem}")
    return {**row, "extra_info": row.get("extra_info") or {}}
