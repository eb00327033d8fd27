"""Users' code by name: an import path (`my_pkg.envs:make_provider`) or the name of a Python
entry point their installed package declares:

    [project.entry-points."tether.environments"]
    my_task = "my_pkg.envs:make_provider"

Four groups: `tether.environments` (env servers), `tether.rewards` (scoring functions served
as single-turn environments), `tether.workflows` (agent loops run by env servers against the
actor's endpoint) and `tether.datasets` (row sources for `learner prepare --from`).
Every failure is a `PluginError`: one line naming the spec, the module and what to fix, so a
process that cannot load its plug-ins stops at start-up, before anything heavy loads.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import traceback
from typing import Any

GROUPS = ("tether.environments", "tether.rewards", "tether.workflows", "tether.datasets")


class PluginError(ValueError):
    """A plug-in that cannot be loaded or built; the message is one line."""


def is_import_path(spec: str) -> bool:
    """`module:attribute`, the module dotted or not, the attribute possibly dotted."""
    module, sep, attribute = spec.partition(":")
    parts = [*module.split("."), *attribute.split(".")]
    return bool(sep) and all(part.isidentifier() for part in parts)


def import_object(spec: str) -> Any:
    """The object an import path names. PluginError when the module does not import (its
    own error, where it was raised) or has no such attribute."""
    if not is_import_path(spec):
        raise PluginError(f"{spec!r} is not an import path: write it as package.module:name")
    module_name, _, attribute = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # the user's module: any error in it is theirs, reported in one line
        raise PluginError(
            f"{spec}: importing {module_name} failed: {one_line(e)}; install the package that"
            " provides it into this environment (pip install -e PATH), or fix the module"
        ) from e
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(
                f"{spec}: module {module_name} has no attribute {attribute!r}"
            ) from None
    return obj


def entry_point_names(group: str) -> list[str]:
    """Names of the installed entry points of `group`."""
    return sorted({point.name for point in _declared(group)})


def entry_point(name: str, group: str) -> importlib.metadata.EntryPoint | None:
    """The installed entry point `name` of `group`, or None. PluginError when two installed
    packages declare it differently: neither is chosen silently."""
    assert group in GROUPS, group
    claims = {point.value: point for point in _declared(group) if point.name == name}
    if len(claims) > 1:
        first, second = list(claims.values())[:2]
        raise PluginError(
            f"{group}: {name!r} is declared by two installed packages ({_owner(first)}: "
            f"{first.value}; {_owner(second)}: {second.value}); uninstall one, or name the one "
            "you want by import path"
        )
    return next(iter(claims.values()), None)


def _declared(group: str) -> list[importlib.metadata.EntryPoint]:
    """Every distribution's entry points of `group`, duplicates included:
    `importlib.metadata.entry_points()` keeps one per name and drops the rest silently. A
    distribution found twice on sys.path declares the same values, which `entry_point`
    counts once. No distribution's METADATA is parsed: that took 150 ms over the ~280
    installed here, reading the entry points alone 14 ms, and this runs at every start."""
    return [
        point
        for dist in importlib.metadata.distributions()
        for point in dist.entry_points
        if point.group == group
    ]


def load(spec: str, group: str) -> Any:
    """What `spec` names: an import path, else an entry point of `group`."""
    if is_import_path(spec):
        return import_object(spec)
    point = entry_point(spec, group)
    if point is None:
        known = ", ".join(entry_point_names(group)) or "none installed"
        raise PluginError(
            f"{spec!r} is neither an import path (package.module:name) nor an installed "
            f"{group} entry point (installed: {known})"
        )
    return import_object(point.value)


def call(spec: str, factory: Any, *args: Any, **kwargs: Any) -> Any:
    """`factory(*args, **kwargs)`, with whatever it raises turned into one line naming the
    plug-in and where in its code it failed (a plug-in rejecting its settings raises here)."""
    if not callable(factory):
        raise PluginError(f"{spec}: names a {type(factory).__name__}, not something to call")
    try:
        return factory(*args, **kwargs)
    except Exception as e:  # the user's code: any error in it is a start-up error of theirs
        raise PluginError(f"{spec}: {one_line(e)} (raised at {_where(e)})") from e


def one_line(error: BaseException) -> str:
    """An exception of the user's code as one line: its type and its message."""
    text = " ".join(str(error).split()) or "(no message)"
    return f"{type(error).__name__}: {text}"


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "?"
    last = frames[-1]
    return f"{last.filename}:{last.lineno}"


def _owner(point: importlib.metadata.EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return dist.name if dist is not None else "?"
