"""Publish and consume trajectories: one message per trajectory, deduplicated by id,
spilled to the Object Store when larger than one message may be (claim check).

Publisher: `Nats-Msg-Id` = trajectory id, so a retried publish is stored once. A full stream
(DiscardNew) or a broker restart is retried with backoff until accepted: an accepted
trajectory is never dropped by the publisher.

Consumer: decodes, and terminates (never redelivers) a message that cannot be decoded,
counting it; one bad message never stops the consumer.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import nats.errors
import nats.js.errors
import prometheus_client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.object_store import ObjectStore

from broker.codec import WireDecodeError, decode, encode
from broker.limits import MAX_PAYLOAD_BYTES
from broker.names import BusNames
from broker.pull import DurablePull, Redeliverable
from broker.wire import Trajectory

log = logging.getLogger(__name__)

CLAIM_HEADER = "Tether-Claim"
"""Header naming the Object Store object that holds a spilled trajectory's body."""
MSG_ID_HEADER = "Nats-Msg-Id"
SPILL_THRESHOLD_BYTES = MAX_PAYLOAD_BYTES - 64 * 1024
"""Bodies above this go to the Object Store; the margin leaves room for headers."""

PUBLISH_RETRIES = prometheus_client.Counter(
    "tether_broker_publish_retries_total",
    "Publishes retried because the stream was full or the broker unreachable",
    ["subject"],
)


class PublishRetry:
    """Backoff for publishes that must eventually be accepted."""

    def __init__(self, subject: str, *, first_s: float = 0.05, max_s: float = 2.0) -> None:
        self.subject, self.delay_s, self.max_s = subject, first_s, max_s

    async def wait(self, error: Exception) -> None:
        PUBLISH_RETRIES.labels(self.subject).inc()
        log.warning(
            "publish to %s failed (%s); retrying in %.2fs", self.subject, error, self.delay_s
        )
        await asyncio.sleep(self.delay_s)
        self.delay_s = min(self.delay_s * 2, self.max_s)


# Network boundary: these errors mean "not accepted yet" (stream full, broker restarting).
# The builtin TimeoutError covers nats-py's own and an ack we stopped waiting for.
RETRYABLE_PUBLISH_ERRORS = (
    TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.APIError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionClosedError,
)

ACK_TIMEOUT_S = 10.0
"""Longest wait for the stream's acknowledgement of one publish before it is retried."""


class TrajectoryPublisher:
    """Publishes trajectories, pipelining a batch's publishes."""

    def __init__(
        self,
        js: JetStreamContext,
        names: BusNames,
        *,
        spill_threshold_bytes: int = SPILL_THRESHOLD_BYTES,
        ack_timeout_s: float = ACK_TIMEOUT_S,
    ) -> None:
        self.js = js
        self.names = names
        self.spill_threshold_bytes = spill_threshold_bytes
        self.ack_timeout_s = ack_timeout_s
        self._spill: ObjectStore | None = None
        self.num_spilled = 0
        self.num_duplicates = 0

    async def publish(self, trajectory: Trajectory) -> None:
        """Publish one trajectory and wait until the stream has stored it."""
        await self.publish_many([trajectory])

    async def publish_many(self, trajectories: list[Trajectory]) -> None:
        """Publish a batch (e.g. a GRPO group), pipelined; returns when all are stored.

        The first pass pipelines with `publish_async`. nats-py leaves its future pending
        forever when the stream answers with an error such as "maximum bytes exceeded"
        (nats-io/nats.py#985), so each ack is awaited at most `ack_timeout_s`, and retries
        use the request-reply `publish`, which raises the stream's error. One backoff spans
        the whole batch, so it grows while the stream stays full.
        """
        pending = [self._prepare(t) for t in trajectories]
        pending = [await p for p in pending]
        retry = PublishRetry(self.names.trajectories.subject)
        first_pass = True
        while pending:
            send = self._send_pipelined if first_pass else self._send_each
            results = await send(pending)
            first_pass = False
            failed = []
            for item, result in zip(pending, results, strict=True):
                if isinstance(result, BaseException):
                    if not isinstance(result, RETRYABLE_PUBLISH_ERRORS):
                        raise result
                    failed.append((item, result))
                elif result.duplicate:
                    self.num_duplicates += 1
            if failed:
                await retry.wait(failed[0][1])
            pending = [item for item, _ in failed]

    async def _send_pipelined(self, items: list[tuple[bytes, dict[str, str]]]) -> list:
        subject = self.names.trajectories.subject
        futures = [
            await self.js.publish_async(subject, body, headers=dict(headers))
            for body, headers in items
        ]
        return await asyncio.gather(
            *(asyncio.wait_for(f, self.ack_timeout_s) for f in futures), return_exceptions=True
        )

    async def _send_each(self, items: list[tuple[bytes, dict[str, str]]]) -> list:
        subject = self.names.trajectories.subject
        return await asyncio.gather(
            *(
                self.js.publish(subject, body, headers=dict(headers), timeout=self.ack_timeout_s)
                for body, headers in items
            ),
            return_exceptions=True,
        )

    async def _prepare(self, trajectory: Trajectory) -> tuple[bytes, dict[str, str]]:
        body = encode(trajectory)
        headers = {MSG_ID_HEADER: trajectory.trajectory_id}
        if len(body) <= self.spill_threshold_bytes:
            return body, headers
        # Claim check: the body goes to the Object Store under the trajectory id; the
        # message carries only the claim. Re-putting the same name on retry is harmless.
        if self._spill is None:
            self._spill = await self.js.object_store(self.names.spill_bucket)
        await self._spill.put(trajectory.trajectory_id, body)
        self.num_spilled += 1
        headers[CLAIM_HEADER] = trajectory.trajectory_id
        return b"", headers


@dataclass
class ReceivedTrajectory(Redeliverable):
    """A decoded trajectory plus the handle to acknowledge its message."""

    trajectory: Trajectory
    msg: Msg
    claim: str | None
    consumer: TrajectoryConsumer

    @property
    def stream_seq(self) -> int:
        return self.msg.metadata.sequence.stream

    async def ack(self) -> None:
        await self.msg.ack()
        if self.claim is not None:
            await self.consumer.delete_claim(self.claim)


class TrajectoryConsumer(DurablePull):
    """Pulls trajectories from the durable learner consumer."""

    def __init__(self, js: JetStreamContext, names: BusNames) -> None:
        super().__init__(js, names, names.trajectories)
        self._spill: ObjectStore | None = None

    async def fetch(self, batch: int = 256, timeout_s: float = 1.0) -> list[ReceivedTrajectory]:
        """Up to `batch` decoded trajectories; [] when none arrived within `timeout_s`."""
        received = []
        for msg in await self._fetch_msgs(batch, timeout_s):
            item = await self._decode(msg)
            if item is not None:
                received.append(item)
        return received

    async def _decode(self, msg: Msg) -> ReceivedTrajectory | None:
        headers = msg.headers or {}
        claim = headers.get(CLAIM_HEADER)
        what = (
            f"(subject {msg.subject}, stream seq {msg.metadata.sequence.stream}, "
            f"msg id {headers.get(MSG_ID_HEADER, '?')})"
        )
        try:
            data = msg.data if claim is None else await self._claimed_body(claim, what)
            trajectory = decode(data, Trajectory, what=what)
            if claim is not None and trajectory.trajectory_id != claim:
                raise WireDecodeError(
                    f"claim {claim!r} {what} holds trajectory {trajectory.trajectory_id!r}"
                )
        except WireDecodeError as e:
            await self._terminate(msg, e)
            if claim is not None:  # a body nobody will ever claim: free its storage
                await self.delete_claim(claim)
            return None
        return ReceivedTrajectory(trajectory=trajectory, msg=msg, claim=claim, consumer=self)

    async def _claimed_body(self, claim: str, what: str) -> bytes:
        if self._spill is None:
            self._spill = await self.js.object_store(self.names.spill_bucket)
        try:
            result = await self._spill.get(claim)
        except nats.js.errors.NotFoundError as e:  # missing or deleted object
            raise WireDecodeError(f"claim {claim!r} {what} names no stored object") from e
        return result.data

    async def delete_claim(self, claim: str) -> None:
        if self._spill is None:
            self._spill = await self.js.object_store(self.names.spill_bucket)
        try:
            await self._spill.delete(claim)
        except nats.js.errors.NotFoundError:
            pass  # already deleted by an earlier ack of a redelivered copy
