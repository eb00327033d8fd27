"""The prompt work queue: the dispatcher publishes prompt tasks, actor replicas pull them.

Each task is delivered to exactly one replica at a time. The replica heart-beats it
(`in_progress`) while its group runs, acks it only after every trajectory of the group is
stored, and naks it with a delay on failure so another replica can take it. A replica that
dies simply stops heart-beating: after the consumer's `ack_wait` the task is redelivered.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from broker.codec import WireDecodeError, decode, encode
from broker.names import BusNames
from broker.pull import DurablePull, Redeliverable
from broker.trajectories import MSG_ID_HEADER, RETRYABLE_PUBLISH_ERRORS, PublishRetry
from broker.wire import PromptTask

log = logging.getLogger(__name__)


async def publish_prompts(js: JetStreamContext, names: BusNames, tasks: list[PromptTask]) -> int:
    """Publish tasks (deduplicated by task_id); returns how many were new to the stream."""
    num_new = 0
    for task in tasks:
        retry = PublishRetry(names.prompts.subject)
        while True:
            try:
                ack = await js.publish(
                    names.prompts.subject, encode(task), headers={MSG_ID_HEADER: task.task_id}
                )
                break
            except RETRYABLE_PUBLISH_ERRORS as e:
                await retry.wait(e)
        num_new += not ack.duplicate
    return num_new


@dataclass
class ReceivedPrompt(Redeliverable):
    task: PromptTask
    msg: Msg

    async def ack(self) -> None:
        await self.msg.ack_sync()

    async def reject(self, reason: str) -> None:
        """Terminate a task that can never succeed (e.g. prompt too long): no redelivery."""
        log.error("rejecting prompt task %s: %s", self.task.task_id, reason)
        await self.msg.term()


class PromptPuller(DurablePull):
    """Pulls prompt tasks from the shared durable consumer of all actor replicas."""

    def __init__(self, js: JetStreamContext, names: BusNames) -> None:
        super().__init__(js, names, names.prompts)

    async def fetch(self, batch: int = 1, timeout_s: float = 1.0) -> list[ReceivedPrompt]:
        received = []
        for msg in await self._fetch_msgs(batch, timeout_s):
            what = f"(subject {msg.subject}, stream seq {msg.metadata.sequence.stream})"
            try:
                received.append(ReceivedPrompt(decode(msg.data, PromptTask, what=what), msg))
            except WireDecodeError as e:
                await self._terminate(msg, e)
        return received
