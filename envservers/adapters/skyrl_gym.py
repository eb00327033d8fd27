"""Run any environment registered in skyrl-gym (PyPI `skyrl-gym`) behind our server.

Hosted as `skyrl_gym:NAME` (served under NAME, the env_class of the user's dataset rows) or
`skyrl_gym:*` (every registered one). Per session, exactly as SkyRL's generator does:

    env = skyrl_gym.make(NAME, env_config=<[envserver.skyrl_gym.NAME]>, extras=<the row>)
    prompt, metadata = env.init(row["prompt"])                  -> Observation(prompt, [], metadata)
    out = env.step(action_text)  # BaseTextEnvStepOutput         -> StepResult(...)
    env.close()

skyrl-gym envs are synchronous (and some do I/O), so init/step/close run in worker
threads. They describe their tools in their prompts, so the Observation offers no specs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from envservers.config import EnvServerConfig
from envservers.types import Environment, EnvProvider, validate_task
from protos.types import Observation, StepResult


class SkyrlGymEnv(Environment):
    def __init__(self, name: str, env_config: dict[str, Any]):
        self.name = name
        self.env_config = env_config
        self.env: Any = None

    async def reset(self, task: dict[str, Any]) -> Observation:
        import skyrl_gym
        from omegaconf import OmegaConf  # skyrl-gym envs read env_config as a DictConfig

        validate_task(task)
        extras = {"reward_spec": {}, "extra_info": {}, **task}

        def make_and_init():
            try:
                env = skyrl_gym.make(
                    self.name, env_config=OmegaConf.create(self.env_config), extras=extras
                )
            except (AssertionError, KeyError, TypeError) as e:  # skyrl-gym checks rows by assert
                raise ValueError(f"skyrl-gym {self.name} rejects the row: {e!r}") from e
            return env, env.init(list(task.get("prompt", [])))

        self.env, (prompt, metadata) = await asyncio.to_thread(make_and_init)
        return Observation(messages=list(prompt), tools=[], metadata=dict(metadata or {}))

    async def step(self, action_text: str) -> StepResult:
        out = await asyncio.to_thread(self.env.step, action_text)
        metadata = dict(out.get("metadata") or {})
        if out.get("postprocessed_action") is not None:
            metadata["postprocessed_action"] = out["postprocessed_action"]
        return StepResult(
            observations=list(out.get("observations") or []),
            reward=float(out.get("reward") or 0.0),
            done=bool(out.get("done")),
            metadata=metadata,
        )

    async def close(self) -> None:
        if self.env is not None:
            await asyncio.to_thread(self.env.close)
            self.env = None


class SkyrlGymProvider(EnvProvider):
    def __init__(self, name: str, env_config: dict[str, Any]):
        self.name = name
        self.env_config = env_config
        self.description = f"skyrl-gym environment {name!r}"

    def make(self) -> SkyrlGymEnv:
        return SkyrlGymEnv(self.name, self.env_config)


def build_providers(name: str, config: EnvServerConfig) -> dict[str, SkyrlGymProvider]:
    """Providers for `skyrl_gym:NAME` (or `*`); ValueError for a name skyrl-gym lacks."""
    import skyrl_gym

    known = sorted(skyrl_gym.registry.keys())
    names = known if name == "*" else [name]
    for n in names:
        if n not in known:
            raise ValueError(f"envs: skyrl_gym:{n}: not registered in skyrl-gym; has {known}")
    return {n: SkyrlGymProvider(n, config.skyrl_gym.get(n, {})) for n in names}
