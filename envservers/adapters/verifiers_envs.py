"""`verifiers` environments on an env server: `verifiers:MODULE` runs the environment's own
rollout against the actor's chat-completions endpoint and scores it with the environment's
own rubric, as an agent workflow (envservers/workflows.py): the actor records the tokens of
every call underneath, so the environment trains as it is.

    envs = ["verifiers:vf_my_env"]
    [envserver.plugins."verifiers:vf_my_env"]   # load_environment's keyword arguments,
    num_examples = 500                          # the same as prepare's --task-config;
    time_limit_s = 120                          # except time_limit_s, ours

The environment is loaded once, at start-up (a module that does not import, or a
load_environment that raises, stops the server with one line), and shared by every episode,
as verifiers shares it between the rollouts of a generate call. Per episode, what
verifiers' own generate does for one row: the environment's sampling arguments, its tools
in `info["oai_tools"]`, `rollout(...)`, then `rubric.score_rollout(...)`. The reward is the
rubric's weighted sum; every reward function's value is a named component (an env metric
`reward/FUNCTION`, and the episode's metadata). Rows come from `learner prepare --from
verifiers:MODULE` (common/verifiers_envs.py).
"""

from __future__ import annotations

import copy
from typing import Any

from common import verifiers_envs
from envservers.types import EnvProvider
from envservers.workflows import workflow_provider

OURS = ("time_limit_s",)


def build_provider(env_id: str, name: str, settings: dict[str, Any]) -> EnvProvider:
    """The provider serving `verifiers:env_id` as `name`. PluginError (one line) when the
    environment cannot be loaded with these settings."""
    ours = {key: settings[key] for key in OURS if key in settings}
    env = verifiers_envs.load(env_id, {k: v for k, v in settings.items() if k not in OURS})
    spec = f"{verifiers_envs.PREFIX}{env_id}"
    return workflow_provider(name, spec, rollout_and_score(env), ours)


def rollout_and_score(env: Any):
    """The workflow that plays one row of `env` as verifiers would, and scores it."""
    model: str | None = None  # the endpoint's model name, asked once

    async def run(client: Any, task: dict[str, Any]) -> dict[str, float]:
        from verifiers.utils.message_utils import cleanup_messages

        nonlocal model
        if model is None:
            model = (await client.models.list()).data[0].id
        prompt, answer, vf_task, info = verifiers_envs.rollout_inputs(task)
        if env.oai_tools and "oai_tools" not in info:
            info["oai_tools"] = env.oai_tools
        prompt = cleanup_messages(prompt)
        completion, state = await env.rollout(client, model, prompt, answer, vf_task, info,
                                              copy.deepcopy(env.sampling_args))  # fmt: skip
        score = await env.rubric.score_rollout(prompt, completion, answer, state,
                                               task=vf_task, info=info)  # fmt: skip
        # "reward" is the total's key: a reward function of that name keeps its value apart
        components = {("reward_function" if k == "reward" else k): v
                      for k, v in score.metrics.items()}  # fmt: skip
        return {"reward": score.reward, **components}

    return run
