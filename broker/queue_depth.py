"""How deep one JetStream work queue is (a stream and the one durable consumer all its takers
share), from JetStream's own answers: pure, so the learner's gauges (learner/bus_metrics.py)
and anything else that scales by the backlog read it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js.api import ConsumerInfo, StreamInfo


@dataclass(frozen=True)
class QueueDepth:
    """One work queue (a stream and the one durable consumer all its takers share), now."""

    pending: int
    """Stored, not yet delivered to the consumer: prompts no actor has taken; trajectories
    the learner has not fetched."""
    ack_pending: int
    """Delivered, not yet acked: prompts whose groups actors are running; trajectories the
    learner holds until a checkpoint covers them (queued for training, or trained since)."""
    redelivered: int
    """Unacked messages delivered more than once (a taker died, nacked or timed out)."""
    messages: int
    """Messages the stream stores (a work queue: every one not yet acked)."""
    bytes: int
    """Bytes the stream stores."""
    max_messages: int | None
    """The stream's message limit; None where unlimited."""
    max_bytes: int | None
    """The stream's byte limit; None where unlimited. A full stream refuses publishes
    (DiscardNew, broker/streams.py): its publishers wait."""


def queue_depth(stream: StreamInfo, consumer: ConsumerInfo) -> QueueDepth:
    """A queue's depth from its stream's and its consumer's info (JetStream's answers)."""
    return QueueDepth(
        pending=consumer.num_pending or 0,
        ack_pending=consumer.num_ack_pending or 0,
        redelivered=consumer.num_redelivered or 0,
        messages=stream.state.messages,
        bytes=stream.state.bytes,
        max_messages=_limit(stream.config.max_msgs),
        max_bytes=_limit(stream.config.max_bytes),
    )


def _limit(value: int | None) -> int | None:
    """JetStream answers "no limit" as -1 (nats-py's own default is None)."""
    return value if value is not None and value > 0 else None
