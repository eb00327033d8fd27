"""The providers an env server hosts, from the entries of `envserver.envs`:

    calculator, noop, sql, python, mcp     built-ins (their own [envserver.NAME] sections)
    skyrl_gym:NAME, openenv:NAME           adapters for environments others wrote
    reasoning_gym:TASK                     a reasoning-gym task, scored by its own scorer
    verifiers:MODULE                       a `verifiers` environment: its own rollout and
                                           rubric, run as a workflow
                                           (envservers/adapters/verifiers_envs.py)
    my_pkg.envs:make                       the user's environment, by import path
    reward:my_pkg.rewards:score            the user's reward function, by import path
    workflow:my_pkg.agents:solve           the user's agent loop, by import path
                                           (envservers/workflows.py)
    my_task                                an installed `tether.environments`,
                                           `tether.rewards` or `tether.workflows` entry point
    NAME=any of the above                  the same, served under NAME (the rows' env_class)

An entry is served under its own text unless aliased (skyrl-gym envs under their skyrl-gym
name). A plug-in's settings are the free-form table `[envserver.plugins.NAME]` (NAME as
served), passed as keyword arguments and so checked by the plug-in itself:

    environment  `make(**settings)` returns an EnvProvider, or `make` is an Environment
                 subclass (a new `make(**settings)` per session)
    reward       `score(completion, row, **settings) -> float`; the setting `retries` is
                 ours (envservers/envs/scored.py)
    workflow     `async run(client, task, **settings) -> float | dict`; the setting
                 `time_limit_s` is ours
    verifiers    `load_environment(**settings)`; `time_limit_s` is ours

Everything is loaded and built here, at start-up: a module that fails to import, a factory
that raises, settings the plug-in rejects and a name claimed twice each stop the server with
one line (common/plugins.py). Built-ins are import paths too, loaded the same way; only
what a server hosts is imported, so hosting `calculator` never imports sqlite or MCP.
"""

from __future__ import annotations

import inspect
from typing import Any

from common import plugins
from common.plugins import PluginError
from envservers.config import EnvServerConfig
from envservers.types import Environment, EnvProvider
from envservers.workflows import workflow_provider

BUILTINS = {
    "calculator": "envservers.envs.calculator:build_provider",
    "noop": "envservers.envs.noop:build_provider",
    "sql": "envservers.envs.sql:build_provider",
    "python": "envservers.envs.python_env:build_provider",
    "mcp": "envservers.envs.mcp_bridge:build_provider",
}
"""Built-in environments: `build_provider(server_config) -> EnvProvider`."""

ENVIRONMENTS, REWARDS, WORKFLOWS = "tether.environments", "tether.rewards", "tether.workflows"
_GROUPS = (ENVIRONMENTS, REWARDS, WORKFLOWS)


def build_providers(config: EnvServerConfig) -> dict[str, EnvProvider]:
    """The providers of every env in config.envs, keyed by the env_class clients use.
    PluginError (one line) for any entry that cannot be built."""
    providers: dict[str, EnvProvider] = {}
    for entry in config.envs:
        alias, spec = split_alias(entry)
        built = _build(spec, alias or spec, config)
        if alias and len(built) != 1:
            raise PluginError(f"envs: {entry!r}: an alias names one environment, not {len(built)}")
        for name, provider in built.items():
            served = alias or name
            if served in providers:
                raise PluginError(f"envs: {served!r} is hosted twice; give one an alias (NAME=...)")
            providers[served] = provider
    unused = sorted(set(config.plugins) - set(providers))
    if unused:
        raise PluginError(
            f"envserver.plugins: settings for {unused}, which this server does not host "
            f"(it hosts {sorted(providers)})"
        )
    return providers


def split_alias(entry: str) -> tuple[str | None, str]:
    """("NAME", spec) for `NAME=spec`; (None, entry) otherwise."""
    alias, sep, spec = entry.partition("=")
    if not sep:
        return None, entry
    if not alias or not spec or ":" in alias:
        raise PluginError(f"envs: {entry!r}: write an alias as NAME=spec (NAME without ':')")
    return alias, spec


def _build(spec: str, name: str, config: EnvServerConfig) -> dict[str, EnvProvider]:
    settings = config.plugins.get(name, {})
    prefix, sep, rest = spec.partition(":")
    configured_elsewhere = spec in BUILTINS or (sep and prefix in ("skyrl_gym", "openenv"))
    if settings and configured_elsewhere:  # never silently ignored
        section = f"[envserver.{prefix if sep else spec}]"
        raise PluginError(
            f"envserver.plugins: {name!r} is not a plug-in; its settings go in {section}"
        )
    if spec in BUILTINS:
        if claimed := _entry_point_claims(spec):
            raise PluginError(
                f"envs: {spec!r} is a built-in environment, and an installed package declares "
                f"it too ({', '.join(point.value for point in claimed.values())}); rename theirs"
            )
        return {spec: plugins.import_object(BUILTINS[spec])(config)}
    if prefix == "skyrl_gym" and sep:
        from envservers.adapters import skyrl_gym

        return skyrl_gym.build_providers(rest, config)
    if prefix == "openenv" and sep:
        from envservers.adapters import openenv

        return {spec: openenv.OpenEnvProvider(config.openenv[rest])}
    if prefix == "reasoning_gym" and sep:
        from envservers.adapters import reasoning_gym

        return {spec: plugins.call(spec, reasoning_gym.build_provider, rest, **settings)}
    if prefix == "verifiers" and sep:
        from envservers.adapters import verifiers_envs

        return {spec: verifiers_envs.build_provider(rest, name, settings)}
    if prefix == "reward" and sep:
        return {spec: reward_provider(name, rest, plugins.import_object(rest), settings)}
    if prefix == "workflow" and sep:
        return {spec: workflow_provider(name, rest, plugins.import_object(rest), settings)}
    if plugins.is_import_path(spec):
        return {spec: environment_provider(spec, plugins.import_object(spec), settings)}
    return {spec: _entry_point(spec, name, settings)}


def _entry_point(spec: str, name: str, settings: dict[str, Any]) -> EnvProvider:
    """The installed environment or reward named `spec`; a name claimed by a built-in and a
    package, or by both groups, is an error rather than a silent choice."""
    claims = _entry_point_claims(spec)
    if len(claims) > 1:
        raise PluginError(
            f"envs: {spec!r} is declared in several plug-in groups ({', '.join(claims)}: "
            f"{', '.join(point.value for point in claims.values())}); rename one"
        )
    if not claims:
        installed = sorted({name for group in _GROUPS for name in plugins.entry_point_names(group)})
        raise PluginError(
            f"envs: unknown environment {spec!r}: not a built-in ({sorted(BUILTINS)}), not an "
            f"import path (package.module:name) and no installed package declares it as a "
            f"{', '.join(_GROUPS)} entry point (installed: {installed or 'none'})"
        )
    ((group, point),) = claims.items()
    target = plugins.import_object(point.value)
    if group == REWARDS:
        return reward_provider(name, point.value, target, settings)
    if group == WORKFLOWS:
        return workflow_provider(name, point.value, target, settings)
    return environment_provider(point.value, target, settings)


def _entry_point_claims(name: str) -> dict[str, Any]:
    """{group: entry point} of every plug-in group that has `name`."""
    return {
        group: point for group in _GROUPS if (point := plugins.entry_point(name, group)) is not None
    }


def environment_provider(spec: str, target: Any, settings: dict[str, Any]) -> EnvProvider:
    """The provider of a user's environment: `target(**settings)` is a provider, or `target`
    is an Environment class (built once now, so that bad settings fail at start-up)."""
    if inspect.isclass(target) and issubclass(target, Environment):
        plugins.call(spec, target, **settings)
        return _ClassProvider(target, settings, spec)
    made = plugins.call(spec, target, **settings)
    if not isinstance(made, EnvProvider):
        raise PluginError(
            f"{spec}: returned a {type(made).__name__}; an environment plug-in returns an "
            "envservers.types.EnvProvider, or is an Environment subclass"
        )
    return made


def reward_provider(name: str, spec: str, score: Any, settings: dict[str, Any]) -> EnvProvider:
    """A scored single-turn environment around the user's `score(completion, row, **kw)`."""
    from envservers.envs.scored import ScoredProvider

    settings = dict(settings)
    retries = settings.pop("retries", 0)
    if not callable(score):
        raise PluginError(f"{spec}: names a {type(score).__name__}, not a scoring function")
    try:
        inspect.signature(score).bind("completion", {}, **settings)
    except TypeError as e:
        raise PluginError(f"{spec}: cannot take the settings {sorted(settings)}: {e}") from None
    except ValueError:
        pass  # a builtin without a signature: it will say so when called
    bound = (lambda completion, row: score(completion, row, **settings)) if settings else score
    return plugins.call(spec, ScoredProvider, name, bound, retries=retries)


class _ClassProvider(EnvProvider):
    def __init__(self, env_class: type[Environment], settings: dict[str, Any], spec: str):
        self.env_class = env_class
        self.settings = settings
        self.description = (env_class.__doc__ or spec).strip().splitlines()[0]

    def make(self) -> Environment:
        return self.env_class(**self.settings)
