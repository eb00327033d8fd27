"""`verifiers` environments (PyPI `verifiers`, its 0.1 `load_environment` modules) as Tether
rows and episodes: the contract between `learner prepare --from verifiers:MODULE`, which
writes the environment's dataset as rows, and an env server hosting `verifiers:MODULE`,
which runs the environment's own rollout against the actor's endpoint and scores it with
the environment's own rubric (envservers/adapters/verifiers_envs.py).

    MODULE                 an installed environment module (`vf-wordle` is module vf_wordle,
                           as verifiers names them), imported and its
                           `load_environment(**settings)` called
    settings               `--task-config KEY=VALUE` for prepare, the table
                           `[envserver.plugins."verifiers:MODULE"]` for the server: the same
                           keyword arguments on both sides, or the rows and the rubric differ

A row of such an environment:

    prompt        the environment's prompt ([system,] user)
    reward_spec   {"ground_truth": its answer}
    extra_info    {"verifiers": {"task": ..., "info": {...}, "prompt": [...]}}

`extra_info.verifiers.prompt` holds the whole prompt when it has more than a system and one
user message (few-shot examples): a row's own prompt is [system,] user, so it keeps the
system message and the last user message for the logs, and the rollout uses the whole.

The adapter speaks the Environment API of verifiers 0.1.3 (`rollout(client, model, prompt,
answer, task, info, sampling_args) -> (completion, state)`, `rubric.score_rollout(...)`),
the one the `load_environment` modules most published environments were written against
use, with the fewest dependencies (no sandbox, MCP or agents SDK). A release whose
Environment has another rollout signature (0.1.8 and later take a RolloutInput) is refused
at load, naming the version to install.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from typing import Any

from common import plugins
from common.plugins import PluginError
from common.rows import Row

PREFIX = "verifiers:"
TESTED_VERSION = "0.1.3"
ROLLOUT_PARAMETERS = ("client", "model", "prompt", "answer", "task", "info", "sampling_args")


def module_name(env_id: str) -> str:
    """The module of an environment id, as verifiers' own loader names it."""
    return env_id.replace("-", "_")


def load(env_id: str, settings: dict[str, Any]) -> Any:
    """The environment `MODULE.load_environment(**settings)` returns; PluginError (one line)
    when verifiers is missing or speaks another API, the module does not import, or it
    returns something that is not a chat-format verifiers Environment."""
    spec = f"{PREFIX}{env_id}"
    if importlib.util.find_spec("verifiers") is None:
        raise PluginError(f"{spec}: needs verifiers (pip install verifiers=={TESTED_VERSION})")
    import verifiers

    rollout = inspect.signature(verifiers.Environment.rollout).parameters
    if tuple(name for name in rollout if name in ROLLOUT_PARAMETERS) != ROLLOUT_PARAMETERS:
        raise PluginError(
            f"{spec}: verifiers {verifiers.__version__} is installed, whose Environment.rollout "
            f"takes ({', '.join(name for name in rollout if name != 'self')}); Tether runs "
            f"verifiers' 0.1 rollout API: pip install verifiers=={TESTED_VERSION}"
        )
    load_environment = plugins.import_object(f"{module_name(env_id)}:load_environment")
    env = plugins.call(spec, load_environment, **settings)
    if not isinstance(env, verifiers.Environment):
        raise PluginError(
            f"{spec}: load_environment returned a {type(env).__name__}, not a verifiers.Environment"
        )
    if env.message_type != "chat":
        raise PluginError(
            f"{spec}: a {env.message_type!r}-format environment; Tether trains chat "
            "environments (message_type='chat')"
        )
    return env


def make_rows(
    env_id: str, *, size: int, seed: int, settings: dict[str, Any], env_class: str | None
) -> list[Row]:
    """`size` rows of the environment's dataset, shuffled by `seed` (its eval dataset when it
    has only that). ValueError naming the row when one cannot travel as a row."""
    env = load(env_id, settings)
    whole = env.dataset if env.dataset is not None else env.eval_dataset
    if len(whole) < size:
        raise ValueError(
            f"{PREFIX}{env_id}: its dataset has {len(whole)} rows, fewer than --size {size}"
        )
    dataset = whole.shuffle(seed=seed).select(range(size))
    return [
        to_row(record, env_id=env_id, env_class=env_class, where=f"{PREFIX}{env_id}: row {n}")
        for n, record in enumerate(dataset, start=1)
    ]


def to_row(record: dict[str, Any], *, env_id: str, env_class: str | None, where: str) -> Row:
    """One record of a verifiers dataset (prompt, answer, task, info) as a row."""
    prompt = record.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(f"{where}: prompt: expected a list of chat messages, got {prompt!r}")
    messages = [_plain_message(m, where=f"{where}: prompt[{k}]") for k, m in enumerate(prompt)]
    users = [m for m in messages if m["role"] == "user"]
    if not users or any(m["role"] not in ("system", "user", "assistant") for m in messages):
        raise ValueError(f"{where}: prompt: roles {[m['role'] for m in messages]}: need a user")
    head = [messages[0]] if messages[0]["role"] == "system" else []
    row_prompt = [*head, users[-1]]
    info = record.get("info") or {}
    if isinstance(info, str):  # datasets that keep info as JSON text, as verifiers allows
        try:
            info = json.loads(info)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: info: neither an object nor JSON text") from None
    verifiers_extra: dict[str, Any] = {"task": record.get("task") or "default", "info": info}
    if row_prompt != messages:
        verifiers_extra["prompt"] = messages
    source = f"{PREFIX}{env_id}"
    return {
        "data_source": source,
        "env_class": env_class or source,
        "prompt": row_prompt,
        "reward_spec": {"ground_truth": record.get("answer") or ""},
        "extra_info": {"verifiers": verifiers_extra},
    }


def rollout_inputs(row: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str, dict[str, Any]]:
    """(prompt, answer, task, info) of a row, as the environment's rollout takes them."""
    extra = (row.get("extra_info") or {}).get("verifiers") or {}
    prompt = list(extra.get("prompt") or row["prompt"])
    answer = row["reward_spec"]["ground_truth"]
    answer = answer if isinstance(answer, str) else str(answer)
    return prompt, answer, extra.get("task") or "default", dict(extra.get("info") or {})


def _plain_message(message: Any, *, where: str) -> dict[str, str]:
    if not isinstance(message, dict):
        raise ValueError(f"{where}: expected a chat message, got {message!r}")
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not isinstance(content, str):
        raise ValueError(
            f"{where}: expected {{'role': str, 'content': str}} (text only), got {message!r}"
        )
    return {"role": role, "content": content}
