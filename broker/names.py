"""Every subject, stream, consumer and bucket name on the bus, in one place.

Names derive from a run namespace so that several runs (or tests) can share one server
without seeing each other's messages. Stream and bucket names may not contain dots.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class WorkQueue:
    """A work-queue stream: what it is called, the subject its messages are published on,
    and the one durable consumer all its takers share (each message goes to one of them)."""

    stream: str
    subject: str
    consumer: str


@dataclass(frozen=True)
class BusNames:
    namespace: str = "tether"

    def __post_init__(self) -> None:
        if not _NAMESPACE_RE.match(self.namespace):
            raise ValueError(
                f"bus namespace {self.namespace!r} must be 1-64 characters of A-Z a-z 0-9 _ -"
            )

    @property
    def prompts(self) -> WorkQueue:
        """Prompt tasks, each taken by exactly one actor replica."""
        return self._work_queue("prompts", consumer="actors")

    @property
    def trajectories(self) -> WorkQueue:
        """Trajectories, one message per trajectory, consumed by the learner."""
        return self._work_queue("trajectories", consumer="learner")

    def _work_queue(self, what: str, *, consumer: str) -> WorkQueue:
        return WorkQueue(
            stream=f"{self.namespace}_{what.upper()}",
            subject=f"{self.namespace}.{what}",
            consumer=consumer,
        )

    # Policy version (and where to find its weights): a KV bucket, one key.
    @property
    def policy_bucket(self) -> str:
        return f"{self.namespace}_policy"

    policy_version_key: str = "version"

    # Claim checks: trajectories too large for one message live here until consumed.
    @property
    def spill_bucket(self) -> str:
        return f"{self.namespace}_spill"

    # Episode checkpoints (broker/episodes.py): a KV bucket, one key per sample of a task in
    # flight.
    @property
    def episodes_bucket(self) -> str:
        return f"{self.namespace}_episodes"

    @property
    def episodes_stream(self) -> str:
        """The stream behind the bucket (JetStream names a KV bucket's stream so)."""
        return f"KV_{self.episodes_bucket}"
