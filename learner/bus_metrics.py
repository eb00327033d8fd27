"""How deep the run's two work queues are, read from JetStream by the learner (rank 0): the
numbers an operator scales actors by (docs/observability.md, "Bus (JetStream)").

    every POLL_INTERVAL_S, a background task of the learner loop:
        stream_info + consumer_info of the prompts and trajectories queues
            ─► queue_depth (pure) ─► learner.metrics.record_bus ─► tether_bus_* gauges

`queue_depth` is the whole mapping; `read_depths` and `poll` are plumbing. The poll never
waits on training nor training on it; a round that cannot read the broker (restarting, a
stream gone) is skipped, logged once per outage, and the gauges keep their last values.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo, StreamInfo

from broker.names import BusNames, WorkQueue
from broker.retry import RETRYABLE_ERRORS
from common.tasks import swallowed_cancel
from learner import metrics

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 5.0
"""How often the learner reads the queues (the shipped Prometheus scrape interval)."""


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


def work_queues(names: BusNames) -> dict[str, WorkQueue]:
    """The queues measured, by the `queue` label their gauges carry."""
    return {"prompts": names.prompts, "trajectories": names.trajectories}


async def read_depths(js: JetStreamContext, names: BusNames) -> dict[str, QueueDepth]:
    """Every work queue's depth, asked of JetStream now."""
    depths = {}
    for label, queue in work_queues(names).items():
        stream = await js.stream_info(queue.stream)
        consumer = await js.consumer_info(queue.stream, queue.consumer)
        depths[label] = queue_depth(stream, consumer)
    return depths


async def poll(
    js: JetStreamContext, names: BusNames, *, interval_s: float = POLL_INTERVAL_S
) -> None:
    """Read and record the depths every `interval_s`, until cancelled."""
    failing = False
    while True:
        try:
            depths = await read_depths(js, names)
        # Network boundary: the broker is restarting, or a stream is not there (yet, or any
        # more: APIError covers NotFoundError). The next round asks again.
        except RETRYABLE_ERRORS as e:
            if not failing:
                log.warning(
                    "cannot read the queue depths (%s); retrying every %.0fs", e, interval_s
                )
            failing = True
        else:
            if failing:
                log.info("queue depths readable again")
            failing = False
            metrics.record_bus(depths)
        if swallowed_cancel():  # a request's wait_for lost our cancellation (common/tasks.py)
            raise asyncio.CancelledError
        await asyncio.sleep(interval_s)
