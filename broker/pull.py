"""What the two work queues' pulling sides share: a lazily bound pull subscription on a
durable consumer, terminating (never redelivering) messages that cannot be decoded, and the
redelivery controls of a message being worked on.

`PromptPuller` (broker/prompts.py) and `TrajectoryConsumer` (broker/trajectories.py) are
`DurablePull`s; `ReceivedPrompt` and `ReceivedTrajectory` are `Redeliverable`.
"""

from __future__ import annotations

import logging

import prometheus_client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from broker.codec import WireDecodeError
from broker.names import BusNames, WorkQueue

log = logging.getLogger(__name__)

CORRUPT_MESSAGES = prometheus_client.Counter(
    "tether_broker_corrupt_messages_total",
    "Messages that could not be decoded: terminated (a policy KV value: ignored)",
    ["subject"],
)


class DurablePull:
    """Pulls raw messages from the durable consumer of the work queue `queue`."""

    def __init__(self, js: JetStreamContext, names: BusNames, queue: WorkQueue):
        self.js = js
        self.names = names
        self.num_corrupt = 0
        """Messages terminated because they could not be decoded."""
        self._queue = queue
        self._sub = None

    async def _fetch_msgs(self, batch: int, timeout_s: float) -> list[Msg]:
        """Up to `batch` messages; [] when none arrived within `timeout_s`."""
        if self._sub is None:
            self._sub = await self.js.pull_subscribe_bind(
                durable=self._queue.consumer, stream=self._queue.stream
            )
        try:
            return await self._sub.fetch(batch, timeout=timeout_s)
        # nats-py raises its own TimeoutError or, from inside a fetch, asyncio's (the
        # builtin): both mean "nothing arrived in time".
        except TimeoutError:
            return []

    async def _terminate(self, msg: Msg, error: WireDecodeError) -> None:
        """Count, log and terminate a message that can never be decoded: no redelivery."""
        self.num_corrupt += 1
        CORRUPT_MESSAGES.labels(msg.subject).inc()
        log.error("terminating undecodable message: %s", error)
        await msg.term()


class Redeliverable:
    """Redelivery controls of a received message `msg` (a field of the subclass)."""

    msg: Msg

    @property
    def num_delivered(self) -> int:
        return self.msg.metadata.num_delivered

    async def nak(self, delay_s: float | None = None) -> None:
        """Hand it back, to be redelivered after `delay_s` (None: at once)."""
        await self.msg.nak(delay=delay_s)

    async def in_progress(self) -> None:
        """Still working on it: restart its ack_wait."""
        await self.msg.in_progress()
