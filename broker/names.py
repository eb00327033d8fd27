"""Every subject, stream, consumer and bucket name on the bus, in one place.

Names derive from a run namespace so that several runs (or tests) can share one server
without seeing each other's messages. Stream and bucket names may not contain dots.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class BusNames:
    namespace: str = "tether"

    def __post_init__(self) -> None:
        if not _NAMESPACE_RE.match(self.namespace):
            raise ValueError(
                f"bus namespace {self.namespace!r} must be 1-64 characters of A-Z a-z 0-9 _ -"
            )

    # Prompt tasks: a work queue, each task taken by exactly one actor replica.
    @property
    def prompts_stream(self) -> str:
        return f"{self.namespace}_PROMPTS"

    @property
    def prompts_subject(self) -> str:
        return f"{self.namespace}.prompts"

    @property
    def prompts_consumer(self) -> str:
        return "actors"

    # Trajectories: one message per trajectory, consumed by the learner.
    @property
    def trajectories_stream(self) -> str:
        return f"{self.namespace}_TRAJECTORIES"

    @property
    def trajectories_subject(self) -> str:
        return f"{self.namespace}.trajectories"

    @property
    def trajectories_consumer(self) -> str:
        return "learner"

    # Policy version (and where to find its weights): a KV bucket, one key.
    @property
    def policy_bucket(self) -> str:
        return f"{self.namespace}_policy"

    policy_version_key: str = "version"

    # Claim checks: trajectories too large for one message live here until consumed.
    @property
    def spill_bucket(self) -> str:
        return f"{self.namespace}_spill"
