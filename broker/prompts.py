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
from broker.trajectories import (
    CORRUPT_MESSAGES,
    MSG_ID_HEADER,
    RETRYABLE_PUBLISH_ERRORS,
    PublishRetry,
)
from broker.wire import PromptTask

log = logging.getLogger(__name__)


async def publish_prompts(js: JetStreamContext, names: BusNames, tasks: list[PromptTask]) -> int:
    """Publish tasks (deduplicated by task_id); returns how many were new to the stream."""
    num_new = 0
    for task in tasks:
        retry = PublishRetry(names.prompts_subject)
        while True:
            try:
                ack = await js.publish(
                    names.prompts_subject, encode(task), headers={MSG_ID_HEADER: task.task_id}
                )
                break
            except RETRYABLE_PUBLISH_ERRORS as e:
                await retry.wait(e)
        num_new += not ack.duplicate
    return num_new


@dataclass
class ReceivedPrompt:
    task: PromptTask
    msg: Msg

    @property
    def num_delivered(self) -> int:
        return self.msg.metadata.num_delivered

    async def ack(self) -> None:
        await self.msg.ack_sync()

    async def nak(self, delay_s: float | None = None) -> None:
        await self.msg.nak(delay=delay_s)

    async def in_progress(self) -> None:
        await self.msg.in_progress()

    async def reject(self, reason: str) -> None:
        """Terminate a task that can never succeed (e.g. prompt too long): no redelivery."""
        log.error("rejecting prompt task %s: %s", self.task.task_id, reason)
        await self.msg.term()


class PromptPuller:
    """Pulls prompt tasks from the shared durable consumer of all actor replicas."""

    def __init__(self, js: JetStreamContext, names: BusNames) -> None:
        self.js = js
        self.names = names
        self.num_corrupt = 0
        self._sub = None

    async def fetch(self, batch: int = 1, timeout_s: float = 1.0) -> list[ReceivedPrompt]:
        if self._sub is None:
            self._sub = await self.js.pull_subscribe_bind(
                durable=self.names.prompts_consumer, stream=self.names.prompts_stream
            )
        try:
            msgs = await self._sub.fetch(batch, timeout=timeout_s)
        # nats-py raises its own TimeoutError or, from inside a fetch, asyncio's (the
        # builtin): both mean "nothing arrived in time".
        except TimeoutError:
            return []
        received = []
        for msg in msgs:
            what = f"(subject {msg.subject}, stream seq {msg.metadata.sequence.stream})"
            try:
                received.append(ReceivedPrompt(decode(msg.data, PromptTask, what=what), msg))
            except WireDecodeError as e:
                self.num_corrupt += 1
                CORRUPT_MESSAGES.labels(msg.subject).inc()
                log.error("terminating undecodable prompt task: %s", e)
                await msg.term()
        return received
