"""The `[broker]` config section every role reads: where the bus is and which run it is."""

from __future__ import annotations

import pydantic

from broker.names import BusNames
from common.config import StrictModel


class BrokerConfig(StrictModel):
    """The `[broker]` section."""

    url: str = "nats://127.0.0.1:4222"
    """NATS server URL. `make run` starts an embedded server and sets this."""
    namespace: str = "tether"
    """Prefix of every stream, subject and bucket of this run; runs sharing a server differ here."""
    prompt_ack_wait_s: float = 10.0
    """A prompt task not heart-beaten for this long (its replica died) is redelivered to
    another replica: the seconds a dead actor's work waits. Replicas heart-beat every
    `actor.heartbeat_s`, well inside it."""
    trajectory_ack_wait_s: float = 600.0
    """A trajectory the learner has not acknowledged for this long is redelivered."""
    max_trajectory_bytes: int = 4 * 1024**3
    """Disk bound of the trajectory stream; publishers wait when it is full."""
    stream_replicas: int = pydantic.Field(1, ge=1, le=5)
    """Copies of every stream and bucket kept by a clustered nats-server (JetStream RAFT):
    3 survives the loss of one server. Must not exceed the cluster's size."""

    @pydantic.field_validator("namespace")
    @classmethod
    def _valid_namespace(cls, namespace: str) -> str:
        BusNames(namespace)  # raises ValueError naming the rule
        return namespace

    @property
    def names(self) -> BusNames:
        return BusNames(self.namespace)

    def stream_limits(self):
        from broker.streams import StreamLimits

        return StreamLimits(
            max_trajectory_bytes=self.max_trajectory_bytes,
            prompt_ack_wait_s=self.prompt_ack_wait_s,
            trajectory_ack_wait_s=self.trajectory_ack_wait_s,
            replicas=self.stream_replicas,
        )
