"""Episode checkpoints in the broker, so an episode outlives its replica: the episodes KV
bucket, one key per sample of a prompt task in flight.

    after each turn that does not end the episode   record(checkpoint)      put
    when the sample's trajectory is stored          mark_stored(task, i)    put (small)
    when the task is redelivered (its actor died)   recall(task)            get x group_size
    when the task is acked or terminated            forget(task)            one stream purge

Keys are `<task id, base64url>.<sample index>`, so one purge by subject removes a group's
keys without leaving delete markers behind. The bucket's TTL (`broker.episode_ttl_s`)
bounds what no ack ever cleans up. A checkpoint is an optimisation, never a requirement:
every call here that the bus fails is logged and answered as "nothing recorded", and the
episode plays on (or starts over).
"""

from __future__ import annotations

import asyncio
import base64
import logging

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from broker.codec import WireDecodeError, decode, encode
from broker.limits import MAX_PAYLOAD_BYTES
from broker.names import BusNames
from broker.wire import EpisodeCheckpoint

log = logging.getLogger(__name__)

BUS_TIMEOUT_S = 2.0
"""A put or get that takes longer (the broker restarting) is given up: the episode does not
wait for its own insurance."""
_BUS_ERRORS = (nats.errors.Error, TimeoutError, OSError)


def episode_key(task_id: str, sample_index: int) -> str:
    """The sample's key: task ids may hold characters a KV key may not (`:`, spaces)."""
    return f"{_task_token(task_id)}.{sample_index}"


def _task_token(task_id: str) -> str:
    return base64.urlsafe_b64encode(task_id.encode()).decode().rstrip("=")


class EpisodeStore:
    def __init__(self, js: JetStreamContext, names: BusNames) -> None:
        self.js, self.names = js, names
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self.js.key_value(self.names.episodes_bucket)
        return self._kv

    async def record(self, checkpoint: EpisodeCheckpoint) -> bool:
        """Store (replace) the sample's checkpoint; False when it was not stored (larger
        than a message may be, or the bus failed)."""
        value = encode(checkpoint)
        key = episode_key(checkpoint.task_id, checkpoint.sample_index)
        if len(value) > MAX_PAYLOAD_BYTES:
            log.info("episode %s: checkpoint of %d bytes exceeds a message", key, len(value))
            return False
        try:
            kv = await asyncio.wait_for(self._bucket(), BUS_TIMEOUT_S)
            await asyncio.wait_for(kv.put(key, value), BUS_TIMEOUT_S)
            return True
        except _BUS_ERRORS as e:
            log.warning("episode %s: checkpoint not recorded: %s", key, e)
            return False

    async def mark_stored(self, task_id: str, sample_index: int, actor_id: str = "") -> bool:
        """The sample's trajectory is stored (by `actor_id`): a redelivery of its task skips
        it."""
        mark = EpisodeCheckpoint(
            task_id=task_id, sample_index=sample_index, stored=True, actor_id=actor_id
        )
        return await self.record(mark)

    async def recall(self, task_id: str, group_size: int) -> dict[int, EpisodeCheckpoint]:
        """The recorded samples of a task, by sample index (a sample without a readable
        checkpoint is absent: it is played from its start)."""
        found: dict[int, EpisodeCheckpoint] = {}
        try:
            kv = await asyncio.wait_for(self._bucket(), BUS_TIMEOUT_S)
            for index in range(group_size):
                key = episode_key(task_id, index)
                try:
                    entry = await asyncio.wait_for(kv.get(key), BUS_TIMEOUT_S)
                except nats.js.errors.NotFoundError:  # never recorded, or purged
                    continue
                saved = _decoded(entry.value, key)
                if saved is not None and (saved.task_id, saved.sample_index) == (task_id, index):
                    found[index] = saved
        except _BUS_ERRORS as e:
            log.warning("task %s: episode checkpoints not read: %s", task_id, e)
        return found

    async def forget(self, task_id: str) -> None:
        """Remove every key of the task (its group is acked or can never run)."""
        subject = f"$KV.{self.names.episodes_bucket}.{_task_token(task_id)}.*"
        try:
            await asyncio.wait_for(
                self.js.purge_stream(self.names.episodes_stream, subject=subject), BUS_TIMEOUT_S
            )
        except (*_BUS_ERRORS, nats.js.errors.NotFoundError) as e:
            log.info("task %s: episode checkpoints not purged (the TTL will): %s", task_id, e)


def _decoded(value: bytes | None, key: str) -> EpisodeCheckpoint | None:
    try:
        return decode(value or b"", EpisodeCheckpoint, what=f"(key {key})")
    except WireDecodeError as e:
        log.error("ignoring an episode checkpoint: %s", e)
        return None
