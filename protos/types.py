"""Results of the env service in message space: what an environment's reset and step return
on the server, and what the gRPC client hands back (protos/client.py). Messages are
OpenAI-style dicts ({"role": ..., "content": ...}); tool specs are OpenAI function specs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Observation:
    """What reset returns: the prompt messages, the tools offered, metadata."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    """What step returns: the messages to append, this step's reward, whether the episode
    ended, metadata (at least `num_tool_calls` and `tool_errors` for tool environments)."""

    observations: list[dict[str, Any]]
    reward: float = 0.0
    done: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
