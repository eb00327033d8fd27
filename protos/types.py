"""Results of the env service in message space: what an environment's reset and step return
on the server, and what the gRPC client hands back (protos/client.py). Messages are
OpenAI-style dicts ({"role": ..., "content": ...}); tool specs are OpenAI function specs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TOOL_FORMATS = ("hermes", "qwen3_coder", "llama3_json", "mistral")
"""How a model writes its tool calls: what an actor may ask of an env server for its
sessions (ResetRequest.tool_format) and what common/tool_formats.py reads."""

DEFAULT_TOOL_FORMAT = "hermes"
"""An env server's format when its config names none (`envserver.tool_format`), and the
agent endpoint's when `actor.env.tool_format` names none."""


def tool_format_problem(name: str) -> str | None:
    """None for a known tool-call format; else the error, with the supported list."""
    if name in TOOL_FORMATS:
        return None
    return f"unknown tool-call format {name!r}: supported are {sorted(TOOL_FORMATS)}"


WORKFLOW = "workflow"
"""Observation.kind of a session the user's agent code runs (RunWorkflow), not stepped."""


@dataclass
class Observation:
    """What reset returns: the prompt messages, the tools offered, metadata, and the kind of
    session ("" stepped by Step, `WORKFLOW` run by RunWorkflow)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    kind: str = ""


@dataclass
class StepResult:
    """What step returns: the messages to append, this step's reward, whether the episode
    ended, metadata (at least `num_tool_calls` and `tool_errors` for tool environments)."""

    observations: list[dict[str, Any]]
    reward: float = 0.0
    done: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class WorkflowOutcome:
    """What running a workflow session gives: its score, its named reward components as the
    metadata, and the error when the agent's code failed (reward 0 then)."""

    reward: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str = ""
