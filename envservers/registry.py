"""Environments by name. Built-ins are imported only when a server hosts them, so hosting
`calculator` never imports sqlite, the MCP SDK or skyrl-gym.

    register("my_env", lambda config: MyProvider(...))   # add your own
    providers = build_providers(config)                  # {env_class: EnvProvider}
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from envservers.config import EnvServerConfig
from envservers.types import EnvProvider

ProviderBuilder = Callable[[EnvServerConfig], EnvProvider]

_REGISTRY: dict[str, ProviderBuilder] = {}


def _lazy(module: str, build: str) -> ProviderBuilder:
    def builder(config: EnvServerConfig) -> EnvProvider:
        return getattr(importlib.import_module(module), build)(config)

    return builder


def register(name: str, builder: ProviderBuilder) -> None:
    """Make `name` hostable; `builder(config)` returns its provider."""
    if ":" in name:
        raise ValueError(f"env name {name!r} must not contain ':'")
    _REGISTRY[name] = builder


def registered() -> list[str]:
    return sorted(_REGISTRY)


def build_providers(config: EnvServerConfig) -> dict[str, EnvProvider]:
    """The providers of every env in config.envs, keyed by the env_class clients use."""
    providers: dict[str, EnvProvider] = {}
    for entry in config.envs:
        prefix, sep, rest = entry.partition(":")
        if not sep:
            if entry not in _REGISTRY:
                raise ValueError(f"envs: unknown environment {entry!r}; known: {registered()}")
            providers[entry] = _REGISTRY[entry](config)
        elif prefix == "skyrl_gym":
            from envservers.adapters import skyrl_gym

            providers.update(skyrl_gym.build_providers(rest, config))
        elif prefix == "openenv":
            from envservers.adapters import openenv

            providers[entry] = openenv.OpenEnvProvider(config.openenv[rest])
    return providers


def _calculator(config: EnvServerConfig) -> EnvProvider:
    from envservers.envs.calculator import CalculatorProvider
    from envservers.latency import ToolLatency

    slow = config.calculator
    latency = None
    if slow.latency_median_s > 0:
        latency = ToolLatency(slow.latency_median_s, slow.latency_p99_s, slow.latency_seed)
    return CalculatorProvider(config.tool_rules, latency)


register("calculator", _calculator)
register("noop", lambda c: importlib.import_module("envservers.envs.noop").NoopProvider())
register("sql", _lazy("envservers.envs.sql", "build_provider"))
register("python", _lazy("envservers.envs.python_env", "build_provider"))
register("mcp", _lazy("envservers.envs.mcp_bridge", "build_provider"))
