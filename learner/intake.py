"""From the trajectory stream to complete groups, holding every training message until a
checkpoint covers it: the learner's half of at-least-once delivery.

    TrajectoryConsumer.fetch ─► trajectory ─┬─ eval ──► ack now ─► eval groups ─► on_eval_group
                                            └─ train ─► GroupAssembler ─► `groups` queue
                                                        message held by id until ack(ids)

- A training trajectory is acknowledged only through `ack(ids)`, which the loop calls after a
  checkpoint covering those ids (trained or counted as dropped) was written. A crash before
  that leaves it unacked, and the next learner gets it again.
- A redelivered copy of an id still held is held too; both are acked together.
- An id already handled (acked by this process, or covered by the restored checkpoint:
  `covered_ids`) is acked again at once, as is a second trajectory for an already filled
  sample slot: neither carries anything new.
- A trajectory whose group disagrees about its size is malformed input: terminated, counted.
- Eval trajectories are acked on arrival: an eval lost in a crash is simply run again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import nats.errors

from broker.trajectories import ReceivedTrajectory, TrajectoryConsumer
from learner.batching import Group, GroupAssembler

log = logging.getLogger(__name__)

ACK_CONCURRENCY = 256


class Intake:
    def __init__(
        self,
        consumer: TrajectoryConsumer,
        *,
        covered_ids: Iterable[str] = (),
        on_eval_group: Callable[[Group], None],
        fetch_batch: int = 256,
        fetch_timeout_s: float = 0.25,
    ) -> None:
        self.consumer = consumer
        self.on_eval_group = on_eval_group
        self.fetch_batch = fetch_batch
        self.fetch_timeout_s = fetch_timeout_s
        self.train = GroupAssembler(seen_ids=set(covered_ids))
        self.evals = GroupAssembler()
        self.groups: asyncio.Queue[Group] = asyncio.Queue()
        self._held: dict[str, list[ReceivedTrajectory]] = {}
        self.num_received = 0
        self.num_redelivered = 0
        self.num_slot_duplicates = 0
        self.num_invalid = 0

    @property
    def num_held(self) -> int:
        return len(self._held)

    async def run(self) -> None:
        """Fetch forever (cancel to stop)."""
        while True:
            try:
                batch = await self.consumer.fetch(self.fetch_batch, self.fetch_timeout_s)
            except nats.errors.Error as e:
                # Network boundary: the client reconnects on its own; try again shortly.
                log.warning("fetching trajectories failed (%r); retrying", e)
                await asyncio.sleep(0.5)
                continue
            except TimeoutError:
                continue  # nats-py lets a bare asyncio timeout out of fetch: nothing came
            for received in batch:
                await self._add(received)

    async def _add(self, received: ReceivedTrajectory) -> None:
        trajectory = received.trajectory
        self.num_received += 1
        if trajectory.is_eval:
            await _quietly(received.ack(), trajectory.trajectory_id)
            try:
                group = self.evals.add(trajectory)
            except ValueError as e:
                log.error("ignoring eval trajectory: %s", e)
                return
            if group is not None:
                self.on_eval_group(group)
            return
        trajectory_id = trajectory.trajectory_id
        if trajectory_id in self._held:
            self.num_redelivered += 1
            self._held[trajectory_id].append(received)
            return
        if trajectory_id in self.train.seen_ids:  # acked already, or covered by the checkpoint
            self.num_redelivered += 1
            await _quietly(received.ack(), trajectory_id)
            return
        try:
            group = self.train.add(trajectory)
        except ValueError as e:  # malformed input (group size disagrees): never trainable
            self.num_invalid += 1
            log.error("terminating invalid trajectory: %s", e)
            await _quietly(received.msg.term(), trajectory_id)
            return
        if trajectory_id not in self.train.seen_ids:  # its sample slot was already filled
            self.num_slot_duplicates += 1
            await _quietly(received.ack(), trajectory_id)
            return
        self._held[trajectory_id] = [received]
        if group is not None:
            self.groups.put_nowait(group)

    async def ack(self, ids: Iterable[str]) -> list[str]:
        """Acknowledge (synchronously) every held copy of `ids`; returns the ids whose ack
        failed: they stay held, and the caller covers them again by its next checkpoint."""
        items = [(i, r) for i in ids for r in self._held.pop(i, [])]
        failed: dict[str, list[ReceivedTrajectory]] = {}
        for start in range(0, len(items), ACK_CONCURRENCY):
            chunk = items[start : start + ACK_CONCURRENCY]
            results = await asyncio.gather(*(_ack_sync(r) for _, r in chunk))
            for (i, r), ok in zip(chunk, results, strict=True):
                if not ok:
                    failed.setdefault(i, []).append(r)
        self._held.update(failed)
        return list(failed)


async def _ack_sync(received: ReceivedTrajectory) -> bool:
    """Ack and wait for the server's confirmation; then delete a spilled body."""
    if not await _quietly(received.msg.ack_sync(), received.trajectory.trajectory_id):
        return False
    if received.claim is not None:
        await _quietly(received.consumer.delete_claim(received.claim), received.claim)
    return True


async def _quietly(call, what: str) -> bool:
    # Network boundary: a lost ack means a redelivery, which the rules above make harmless.
    try:
        await call
        return True
    except (nats.errors.Error, TimeoutError) as e:
        log.warning("ack/term of %s failed: %s", what, e)
        return False
