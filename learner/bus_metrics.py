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

from nats.js import JetStreamContext

from broker.names import BusNames, WorkQueue
from broker.queue_depth import QueueDepth, queue_depth
from broker.retry import RETRYABLE_ERRORS
from common.tasks import swallowed_cancel
from learner import metrics

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 5.0
"""How often the learner reads the queues (the shipped Prometheus scrape interval)."""


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
