"""One config system for every role: a TOML or YAML file, validated by pydantic, with
dotted command-line overrides on top.

A single file may hold all roles; each role validates its own section (`[learner]`,
`[actor]`, `[envserver]`, `[broker]`, `[storage]`, ...) against its own pydantic model, so
no role imports another's config, and every role refuses a section name it does not know
(a misspelt `[brokr]` must not pass silently). The launchers validate a whole file at once
(`deploy/config.py` `RunConfig`). This module imports neither torch nor vLLM: a bad config
must fail in well under a second.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

C = TypeVar("C", bound=pydantic.BaseModel)

SECTIONS = (
    "broker", "envserver", "learner", "actor", "storage", "restarts", "elastic", "local",
    "prepare", "ray",
)  # fmt: skip
"""Every top-level section a config file may hold (deploy/config.py `RunConfig` has one
field per name; a test keeps the two equal)."""


class StrictModel(pydantic.BaseModel):
    """Base for config sections: unknown keys are errors (a typo must not pass silently)."""

    model_config = pydantic.ConfigDict(extra="forbid", validate_assignment=True)


class CertKeyFiles(StrictModel):
    """Base of the TLS sections: the certificate a process presents and its private key,
    file paths only (keys never sit in a config file); both or neither."""

    cert_file: str = ""
    """Certificate (PEM) this process presents: an env server's own, or a client's for
    mutual TLS (actors to env servers, every process to the bus); with key_file."""
    key_file: str = ""
    """That certificate's private key (PEM file)."""

    @pydantic.model_validator(mode="after")
    def _cert_with_key(self) -> CertKeyFiles:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("cert_file and key_file: give both or neither")
        return self


def read_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ValueError(f"config file {path} must end in .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"config file {path} is not valid {path.suffix[1:]}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping at the top level")
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value); the value is parsed as JSON when it can be
    (numbers, booleans, lists), else kept as a string."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ValueError(f"override {item!r} must look like section.field=value")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        keys, value = parse_override(item)
        node = data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {key!r} is not a section")
        node[keys[-1]] = value
    return data


def load_section(
    model: type[C], path: str | Path | None, section: str, overrides: list[str] = ()
) -> C:
    """Validate `section` of the config file (plus overrides) as `model`.

    Overrides are dotted from the top of the file (`learner.lr=1e-5`). Errors name the file,
    the field and the rule broken.
    """
    data = read_sections(path, overrides)
    where = f"{path}" if path else "command line"
    try:
        return model.model_validate(data.get(section, {}))
    except pydantic.ValidationError as e:
        raise ValueError(f"invalid config ({where}):\n" + error_lines(e, prefix=section)) from None


def read_sections(path: str | Path | None, overrides: list[str] = ()) -> dict[str, Any]:
    """The file's sections with the overrides applied; ValueError for an unknown section."""
    data = read_config_file(path) if path else {}
    data = apply_overrides(data, list(overrides))
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        where = f"{path}" if path else "command line"
        raise ValueError(
            f"invalid config ({where}): unknown section(s) {', '.join(unknown)}; "
            f"known: {', '.join(SECTIONS)}"
        )
    return data


def error_lines(error: pydantic.ValidationError | list[dict], *, prefix: str = "") -> str:
    """One `  dotted.key: message` line per problem (of an error, or a list of its errors)."""
    lines = []
    for err in error.errors() if isinstance(error, pydantic.ValidationError) else error:
        key = ".".join(str(p) for p in err["loc"])
        where = f"{prefix}.{key}" if prefix and key else prefix or key
        lines.append(f"  {where}: {err['msg']}" if where else f"  {err['msg']}")
    return "\n".join(lines)
