"""Is a configured model a directory that exists? Checked by the `learner` and `actor`
command lines before anything heavy loads, so a typo is one line and exit code 2 within a
second instead of an `OSError: Repo id must be in the form ...` after torch and vLLM start.

A model setting (`learner.model_path`, `learner.ref_model_path`, `actor.engine.model`) is
either a local directory or a Hugging Face hub id. The rule:

    exists on disk          -> a directory holding config.json, else refused
    absolute, ./ ../ ~      -> a path: refused when missing
    has a / and is not org/name (two or more /, or odd characters)   -> a path: refused
    name or org/name (gpt2, Qwen/Qwen3-0.6B), a URL (s3://...)       -> left to the loader
    anything else (spaces, colons: "set me: ...")                    -> refused

So a relative `org/name` that does not exist here is taken for a hub id (these machines
may have no network: the loader then says it cannot reach the hub). Write `./org/name` to
mean a local directory.
"""

from __future__ import annotations

import re
from pathlib import Path

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
"""`name` or `org/name`, as the Hugging Face hub spells repository ids."""


def looks_like_path(value: str) -> bool:
    """True when `value` can only mean a local path (see the module docstring)."""
    if "://" in value:
        return False
    if value.startswith(("/", "./", "../", "~")) or value in (".", ".."):
        return True
    return "/" in value and HUB_ID.fullmatch(value) is None


def model_dir_problem(value: str, *, key: str) -> str | None:
    """What is wrong with the model setting `key` = `value` (one line naming both), or None
    for a model directory or a hub id."""
    if not value:
        return f"{key} is empty: set it to a model directory (or a hub id)"
    path = Path(value).expanduser()
    if path.exists():
        if not path.is_dir():
            return f"{key}: {value} is a file, not a model directory (config.json, weights)"
        if not (path / "config.json").is_file():
            return f"{key}: {value} holds no config.json: not a Hugging Face model directory"
        return None
    if looks_like_path(value):
        return f"{key}: {value} does not exist (a model directory; a hub id looks like org/name)"
    if "://" not in value and HUB_ID.fullmatch(value) is None:
        return f"{key}: {value!r} is neither a directory here nor a hub id (org/name)"
    return None
