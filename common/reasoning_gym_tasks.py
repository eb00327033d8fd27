"""reasoning-gym's procedural tasks as SkyRL rows, and each row back to the entry it was made
from: the contract between `learner prepare --from reasoning_gym:TASK`, which writes the rows,
and an env server hosting `reasoning_gym:TASK`, which scores answers to them with the task's
own `score_answer(answer, entry)`.

A row carries the recipe of its entry, not the entry:

    extra_info["reasoning_gym"] = {"task": "chain_sum", "config": {"seed": 0, "size": 500, ...},
                                   "index": 7, "digest": "<sha256 of question and answer>",
                                   "version": "0.1.25"}

and the env server regenerates `create_dataset(task, **config)[index]` (once per entry: the
samples of a group share it). The entry itself cannot travel as JSON for every task: arc_agi
and rearc keep grids as tuples that their scorers compare with `==` (after a JSON round trip
a right answer scores 0.05), codeio and graph_color have integer keys, gsm_symbolic holds
Fractions. An entry depends only on its config and index (reasoning-gym seeds each one), so
regenerating is exact for every task; the digest catches a server whose reasoning-gym makes
a different entry (another version) instead of scoring against the wrong answer.

reasoning-gym is imported only when a task is made or scored (`learner prepare --help` and a
server hosting other envs never load it).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib.metadata
import json
from typing import Any

from common.rows import Row, json_problem

SYSTEM_PROMPT = (
    "Solve the problem. Think step by step if it helps, then give only the final answer as "
    "<answer>ANSWER</answer>."
)
RESERVED = ("seed", "size")  # set by the seed and size arguments, never by the task config


def known_tasks() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def check_task(task: str) -> None:
    """ValueError naming a few known tasks when reasoning-gym has no task `task`."""
    tasks = known_tasks()
    if task in tasks:
        return
    near = difflib.get_close_matches(task, tasks, n=3) or tasks[:5]
    raise ValueError(
        f"reasoning-gym has no task {task!r} ({len(tasks)} tasks, e.g. {', '.join(near)})"
    )


def make_dataset(task: str, config: dict[str, Any]) -> Any:
    """`reasoning_gym.create_dataset(task, **config)`; ValueError naming the task when the
    task is unknown or its config class refuses `config`."""
    import reasoning_gym

    check_task(task)
    try:
        return reasoning_gym.create_dataset(task, **config)
    except (TypeError, ValueError, AssertionError) as e:  # its config dataclass and validate()
        raise ValueError(f"reasoning_gym:{task}: config {config} refused: {e}") from None


def make_rows(
    task: str,
    *,
    size: int,
    seed: int,
    config: dict[str, Any] | None = None,
    system: str = SYSTEM_PROMPT,
    env_class: str | None = None,
) -> list[Row]:
    """`size` SkyRL rows of `task` (entries 0..size-1 of the dataset with this seed and
    config), in order. The env class defaults to `reasoning_gym:TASK`, what a server hosting
    that entry serves; `system` (empty for none) is the prompt's system message."""
    config = dict(config or {})
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"reasoning_gym:{task}: size must be a whole number >= 1, got {size!r}")
    for name in RESERVED:
        if name in config:
            raise ValueError(f"reasoning_gym:{task}: task config {name!r}: set it with --{name}")
    config = {**config, "seed": seed, "size": size}
    if (problem := json_problem(config, field="task config")) is not None:
        raise ValueError(f"reasoning_gym:{task}: {problem}")
    dataset = make_dataset(task, config)
    version = importlib.metadata.version("reasoning-gym")
    rows = []
    for index in range(size):
        entry = dataset[index]
        recipe = {
            "task": task,
            "config": config,
            "index": index,
            "digest": digest(entry),
            "version": version,
        }
        prompt = [{"role": "user", "content": entry["question"]}]
        if system:
            prompt.insert(0, {"role": "system", "content": system})
        rows.append(
            {
                "data_source": f"reasoning_gym:{task}",
                "env_class": env_class or f"reasoning_gym:{task}",
                "prompt": prompt,
                "reward_spec": {"ground_truth": entry["answer"]},
                "extra_info": {"task_key": f"{task}-{recipe['digest']}", "reasoning_gym": recipe},
            }
        )
    return rows


def digest(entry: dict[str, Any]) -> str:
    """A short stable hash of an entry's question and answer (its identity across runs)."""
    text = json.dumps([entry["question"], entry["answer"]], default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def regenerate(row: dict[str, Any], *, task: str) -> tuple[Any, dict[str, Any]]:
    """(dataset, entry) the row was made from, for scoring with `dataset.score_answer`.
    ValueError naming the field when the row carries no usable recipe, is for another task,
    or regenerates to a different entry."""
    field = "extra_info.reasoning_gym"
    recipe = (row.get("extra_info") or {}).get("reasoning_gym")
    if not isinstance(recipe, dict):
        raise ValueError(
            f"{field}: missing; a reasoning_gym:{task} row carries the recipe of its entry "
            f"(make rows with `learner prepare --from reasoning_gym:{task}`)"
        )
    for key, kind in (("task", str), ("config", dict), ("index", int), ("digest", str)):
        if not isinstance(recipe.get(key), kind) or isinstance(recipe.get(key), bool):
            raise ValueError(f"{field}.{key}: expected {kind.__name__}, got {recipe.get(key)!r}")
    if recipe["task"] != task:
        raise ValueError(f"{field}.task: {recipe['task']!r}, but this env scores {task!r}")
    config = json.dumps(recipe["config"], sort_keys=True)
    dataset = _dataset(task, config)
    if not 0 <= recipe["index"] < len(dataset):
        raise ValueError(f"{field}.index: {recipe['index']} is outside the dataset's size")
    entry = _entry(task, config, recipe["index"])
    if digest(entry) != recipe["digest"]:
        raise ValueError(
            f"{field}: entry {recipe['index']} of {task} regenerates differently here; the rows "
            f"were made with reasoning-gym {recipe.get('version', '?')}, this server has "
            f"{importlib.metadata.version('reasoning-gym')}: install that version"
        )
    return dataset, entry


@functools.lru_cache(maxsize=32)
def _dataset(task: str, config_json: str) -> Any:
    return make_dataset(task, json.loads(config_json))


@functools.lru_cache(maxsize=4096)
def _entry(task: str, config_json: str, index: int) -> dict[str, Any]:
    return _dataset(task, config_json)[index]
