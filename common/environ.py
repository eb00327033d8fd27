"""Environment variables set for the duration of a block: for settings that a library
reads from the environment once, when an object is built or a child process is spawned."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def environ_set(values: Mapping[str, str] | None) -> Iterator[None]:
    """os.environ with `values` set while the body runs, restored afterwards (a variable
    that was unset is unset again)."""
    saved = {key: os.environ.get(key) for key in values or {}}
    os.environ.update(values or {})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
