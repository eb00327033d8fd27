"""The wire form of what environments return: `Observation`, `StepResult` and
`WorkflowOutcome` (message space, protos/types.py) as the env service's protobuf
responses, and the cap on how long one observation may be (a tool that prints megabytes
must not flood the model's context).
"""

from __future__ import annotations

import json
from typing import Any

from envservers.tools import truncate_output
from protos import env_pb2
from protos.types import Observation, StepResult, WorkflowOutcome


def _messages(messages: list[dict[str, Any]]) -> list[env_pb2.ChatMessage]:
    out = []
    for m in messages:
        content = m.get("content", "")
        out.append(
            env_pb2.ChatMessage(
                role=str(m.get("role", "")),
                content=content if isinstance(content, str) else json.dumps(content),
                name=str(m.get("name") or ""),
            )
        )
    return out


def cap_observations(response: env_pb2.StepResponse, max_chars: int) -> int:
    """Cut every observation longer than `max_chars` (head and tail around a visible marker),
    so one huge tool output cannot flood the model's context; returns how many were cut."""
    num_cut = 0
    for message in response.observations:
        if len(message.content) > max_chars:
            message.content = truncate_output(message.content, max_chars)
            num_cut += 1
    return num_cut


def reset_response(session_id: str, obs: Observation) -> env_pb2.ResetResponse:
    return env_pb2.ResetResponse(
        session_id=session_id,
        messages=_messages(obs.messages),
        tools=[env_pb2.ToolSpec(json=json.dumps(t)) for t in obs.tools],
        metadata_json=json.dumps(obs.metadata, default=str),
        kind=obs.kind,
    )


def workflow_response(outcome: WorkflowOutcome) -> env_pb2.RunWorkflowResponse:
    return env_pb2.RunWorkflowResponse(
        reward=float(outcome.reward),
        metadata_json=json.dumps(outcome.metadata, default=str),
        error=outcome.error,
    )


def step_response(result: StepResult) -> env_pb2.StepResponse:
    return env_pb2.StepResponse(
        observations=_messages(result.observations),
        reward=float(result.reward),
        done=bool(result.done),
        metadata_json=json.dumps(result.metadata, default=str),
    )
