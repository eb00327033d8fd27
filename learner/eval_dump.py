"""Eval trajectories on disk, in the layout and fields SkyRL users analyse.

    <run_dir>/evals/global_step_<version>/<env_class>.jsonl      one line per trajectory
    <run_dir>/evals/global_step_<version>/aggregated_results.jsonl  one line: the eval metrics

Each trajectory line holds:

    input_prompt     the templated prompt, decoded
    output_response  everything after the prompt, decoded: assistant turns and the templated
                     observations between them (with a tokenizer's default `decode`, special
                     tokens stay, so `<|im_start|>assistant` counts turns as in the seeds)
    score            the episode's reward (one number, not per-token scores)
    stop_reason      why the episode ended (`stop`, `length`, `max_turns`, `error:*`, ...)
    env_extras       task_key, data_source, env_class, group_id, sample_index,
                     trajectory_id, num_turns, num_tool_calls, env_metrics, and
                     versions {min, max} of the policy tokens (null when there are none)

`decode(list[int]) -> str` is passed in (a HF tokenizer's `decode`), so this module needs no
model. The trajectory has no task key on the wire: pass `task_keys` (group id -> dataset
key); an unknown one is written as null. A file is rewritten whole, so re-running the eval
of one version (after a resume) replaces its dump instead of appending to it.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from broker.codec import token_arrays
from broker.wire import Trajectory
from common.files import write_atomically

AGGREGATED_RESULTS = "aggregated_results.jsonl"
_UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def eval_dir(run_dir: str | Path, version: int) -> Path:
    return Path(run_dir) / "evals" / f"global_step_{version}"


def trajectory_record(
    trajectory: Trajectory, *, decode: Callable[[list[int]], str], task_key: str | None = None
) -> dict:
    """One JSONL record (see the module docstring)."""
    arrays = token_arrays(trajectory)
    token_ids = arrays.token_ids.tolist()
    policy_versions = arrays.versions[arrays.versions >= 0]
    versions = (
        {"min": int(policy_versions.min()), "max": int(policy_versions.max())}
        if policy_versions.size
        else None
    )
    return {
        "input_prompt": decode(token_ids[: trajectory.prompt_len]),
        "output_response": decode(token_ids[trajectory.prompt_len :]),
        "score": float(trajectory.reward),
        "stop_reason": trajectory.stop_reason,
        "env_extras": {
            "task_key": task_key,
            "data_source": trajectory.data_source,
            "env_class": trajectory.env_class,
            "group_id": trajectory.group_id,
            "sample_index": trajectory.sample_index,
            "trajectory_id": trajectory.trajectory_id,
            "num_turns": trajectory.num_turns,
            "num_tool_calls": trajectory.num_tool_calls,
            "env_metrics": dict(trajectory.env_metrics),
            "versions": versions,
        },
    }


def write_eval_dump(
    run_dir: str | Path,
    version: int,
    groups: Iterable[Sequence[Trajectory]],
    *,
    decode: Callable[[list[int]], str],
    task_keys: Mapping[str, str] | None = None,
) -> list[Path]:
    """Write one `<env_class>.jsonl` per environment; returns the paths written.

    Groups are sequences of trajectories or objects with `.trajectories`
    (`learner.batching.Group`); lines follow group order, then sample order.
    """
    task_keys = task_keys or {}
    lines_by_env: dict[str, list[str]] = defaultdict(list)
    for group in groups:
        for trajectory in getattr(group, "trajectories", group):
            record = trajectory_record(
                trajectory, decode=decode, task_key=task_keys.get(trajectory.group_id)
            )
            lines_by_env[trajectory.env_class].append(json.dumps(record, ensure_ascii=False))
    directory = eval_dir(run_dir, version)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for env_class, lines in sorted(lines_by_env.items()):
        path = directory / f"{env_file_name(env_class)}.jsonl"
        write_atomically(path, "".join(line + "\n" for line in lines))
        paths.append(path)
    return paths


def write_aggregated_results(run_dir: str | Path, version: int, metrics: Mapping) -> Path:
    """The eval's metrics as one JSON line, next to the trajectory dumps."""
    directory = eval_dir(run_dir, version)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / AGGREGATED_RESULTS
    write_atomically(path, json.dumps(dict(metrics), ensure_ascii=False) + "\n")
    return path


def env_file_name(env_class: str) -> str:
    """`env_class` as a file name: anything but letters, digits, `.`, `_`, `-` becomes `_`."""
    if not env_class:
        raise ValueError("env_class is empty")
    name = _UNSAFE_FILE_CHARS.sub("_", env_class)
    return "_" + name if name.startswith(".") else name
