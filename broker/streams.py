"""Create (idempotently) every stream, consumer and bucket a Tether run uses.

All streams use file storage and refuse new messages when full (DiscardNew): a full stream
is backpressure on the publisher, never silent eviction of accepted work. Consumers bound
the number of unacknowledged messages (`max_ack_pending`).

The trajectory stream's `max_bytes` is reserved in the server's file store while the stream
exists. When the store is fully reserved, the namespaces of runs that are done are deleted
and the streams created again; if that was not enough, `StoreFull` says who holds the store
(broker/runs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from broker import runs
from broker.limits import MAX_PAYLOAD_BYTES
from broker.names import BusNames, WorkQueue


@dataclass(frozen=True)
class StreamLimits:
    """Capacity and redelivery settings of the run's streams and consumers."""

    max_trajectory_bytes: int = 4 * 1024**3
    """Disk bound of the trajectory stream; when full, publishers wait (DiscardNew). The
    server reserves it in its file store while the stream exists (docs/broker.md)."""
    max_prompt_msgs: int = 100_000
    duplicate_window_s: float = 3600.0
    """Window in which a re-published Nats-Msg-Id is recognised and stored once."""
    prompt_ack_wait_s: float = 10.0
    """An actor that stops heart-beating a prompt for this long loses it to another actor."""
    prompt_max_ack_pending: int = 1024
    trajectory_ack_wait_s: float = 600.0
    trajectory_max_ack_pending: int = 65_536
    """Trajectories the learner may hold unacknowledged (until its next checkpoint)."""
    replicas: int = 1
    """Copies of each stream and bucket on a clustered server; consumers inherit it."""
    episode_ttl_s: float = 86_400.0
    """How long an episode checkpoint outlives its last update (broker/episodes.py)."""


async def ensure_streams(
    js: JetStreamContext, names: BusNames, limits: StreamLimits = StreamLimits()
) -> None:
    """Create or update the streams, consumers and buckets. Safe to call from every process.
    On a fully reserved store the namespaces of done runs are deleted and everything tried
    once more; `StoreFull` if that was not enough."""
    try:
        await _ensure_all(js, names, limits)
        return
    except nats.js.errors.APIError as e:
        if not runs.is_store_full(e):
            raise
    await runs.reclaim_done(js, keep=names.namespace)
    try:
        await _ensure_all(js, names, limits)
    except nats.js.errors.APIError as e:
        if not runs.is_store_full(e):
            raise
        raise await runs.store_full_error(js, names, limits.max_trajectory_bytes) from e


async def _ensure_all(js: JetStreamContext, names: BusNames, limits: StreamLimits) -> None:
    """The buckets, then the work queues: the trajectory stream, the only one that reserves
    store, comes last, so a namespace that does not fit is left holding no reservation."""
    # Buckets that exist are left as they are (created again, on a full store they would
    # fail like a work queue's stream: see `_add_or_update`).
    try:
        await js.key_value(names.policy_bucket)
    except nats.js.errors.NotFoundError:
        kv = KeyValueConfig(
            bucket=names.policy_bucket,
            history=1,
            storage=StorageType.FILE,
            replicas=limits.replicas,
        )
        await js.create_key_value(config=kv)
    try:
        await js.key_value(names.episodes_bucket)
    except nats.js.errors.NotFoundError:
        episodes = KeyValueConfig(
            bucket=names.episodes_bucket,
            history=1,
            ttl=limits.episode_ttl_s,
            max_value_size=MAX_PAYLOAD_BYTES,
            storage=StorageType.FILE,
            replicas=limits.replicas,
        )
        await js.create_key_value(config=episodes)
    try:
        await js.object_store(names.spill_bucket)
    except nats.js.errors.NotFoundError:
        spill = ObjectStoreConfig(storage=StorageType.FILE, replicas=limits.replicas)
        await js.create_object_store(bucket=names.spill_bucket, config=spill)
    for queue, bounds in _work_queues(names, limits):  # prompts, then trajectories
        await _ensure_work_queue(js, queue, limits, bounds)


@dataclass(frozen=True)
class _QueueBounds:
    """One work queue's consumer settings and its stream's bound."""

    ack_wait_s: float
    max_ack_pending: int
    stream_bound: dict[str, int]
    """`max_msgs` or `max_bytes` of the stream."""


def _work_queues(names: BusNames, limits: StreamLimits) -> list[tuple[WorkQueue, _QueueBounds]]:
    prompts = _QueueBounds(
        limits.prompt_ack_wait_s,
        limits.prompt_max_ack_pending,
        {"max_msgs": limits.max_prompt_msgs},
    )
    trajectories = _QueueBounds(
        limits.trajectory_ack_wait_s,
        limits.trajectory_max_ack_pending,
        {"max_bytes": limits.max_trajectory_bytes},
    )
    return [(names.prompts, prompts), (names.trajectories, trajectories)]


# What every work-queue stream is: file-backed, each message removed once acked, refusing
# new messages when full (DiscardNew: publishers wait, nothing is evicted).
_WORK_QUEUE_POLICY = {
    "retention": RetentionPolicy.WORK_QUEUE,
    "storage": StorageType.FILE,
    "discard": DiscardPolicy.NEW,
    "max_msg_size": MAX_PAYLOAD_BYTES,
}


async def _ensure_work_queue(
    js: JetStreamContext, queue: WorkQueue, limits: StreamLimits, bounds: _QueueBounds
) -> None:
    """`queue`'s stream (`_WORK_QUEUE_POLICY`, deduplicated by Nats-Msg-Id, bounded by
    `bounds`) and its durable, explicitly acked consumer."""
    stream = StreamConfig(
        name=queue.stream,
        subjects=[queue.subject],
        duplicate_window=limits.duplicate_window_s,
        num_replicas=limits.replicas,
        **_WORK_QUEUE_POLICY,
        **bounds.stream_bound,
    )
    await _add_or_update(js, stream)
    consumer = ConsumerConfig(
        durable_name=queue.consumer,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=bounds.ack_wait_s,
        max_ack_pending=bounds.max_ack_pending,
        filter_subject=queue.subject,
    )
    # Creating a durable consumer with its current configuration is a no-op on the server;
    # a changed configuration is applied as an update.
    await js.add_consumer(queue.stream, config=consumer)


async def _add_or_update(js: JetStreamContext, stream: StreamConfig) -> None:
    """Create `stream`, or update it in place when it exists (maybe with other limits). An
    existing stream is never added again: nats-server checks a create's reservation before
    it sees that the stream exists, so a re-create on a full store fails (err 10047), while
    an update reserves only the difference."""
    try:
        await js.stream_info(stream.name)
    except nats.js.errors.NotFoundError:
        try:
            await js.add_stream(config=stream)
            return
        except nats.js.errors.BadRequestError:
            pass  # created meanwhile by another process: update it
    await js.update_stream(config=stream)


async def ensure_streams_fresh_consumer(
    js: JetStreamContext, names: BusNames, limits: StreamLimits = StreamLimits()
) -> None:
    """`ensure_streams` with the trajectories consumer created anew (the learner at its
    start): a fresh consumer delivers every unacked trajectory now instead of after
    ack_wait (the stream is a work queue: acked ones are gone)."""
    await ensure_streams(js, names, limits)
    try:
        await js.delete_consumer(names.trajectories.stream, names.trajectories.consumer)
    except nats.js.errors.NotFoundError:
        pass
    await ensure_streams(js, names, limits)
