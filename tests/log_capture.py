"""What a test's code logged on given loggers (vLLM's may or may not propagate to the root,
so a handler goes on each logger itself)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class Said(logging.Handler):
    """The messages (WARNING and above) logged on the loggers it is added to."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def said_on(*names: str) -> Iterator[Said]:
    """A `Said` on the loggers `names` for the block, removed afterwards."""
    said = Said()
    loggers = [logging.getLogger(name) for name in names]
    for logger in loggers:
        logger.addHandler(said)
    try:
        yield said
    finally:
        for logger in loggers:
            logger.removeHandler(said)
