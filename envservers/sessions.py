"""An env server's open sessions: what the servicer (envservers/service.py) keeps of each
episode between calls, so that a retried call gets the answer it already had."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from envservers.types import Environment
from protos import env_pb2
from protos.types import Observation

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Session:
    id: str
    env_class: str
    env: Environment
    reset_response: env_pb2.ResetResponse
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_seq: int = 0
    last_response: env_pb2.StepResponse | None = None
    workflow_response: env_pb2.RunWorkflowResponse | None = None
    done: bool = False
    closed: bool = False


@dataclass(frozen=True)
class Reset:
    env: Environment
    observation: Observation


async def close_env(env: Environment) -> None:
    try:
        await env.close()
    except Exception:  # a failing close must not take the server down; it is logged
        log.exception("closing an environment failed")
