"""From the trajectory stream to complete groups, holding every message until a checkpoint
covers it: the learner's half of at-least-once delivery.

    TrajectoryConsumer.fetch ─► trajectory ─┬─ eval ──► eval groups ─► on_eval_group
                                            └─ train ─► GroupAssembler ─► `groups` queue
                                  every message held by id until ack(ids)

- A trajectory is acknowledged only through `ack(ids)`, which the loop calls after a
  checkpoint covering those ids (trained or counted as dropped; eval ones counted as such)
  was written. A crash before that leaves it unacked, and the next learner gets it again:
  so the learner's books (learner/ledger.py) count every stored message exactly once, eval
  ones included, across any number of restarts.
- A redelivered copy of an id still held is held too; both are acked together.
- An id already handled (acked by this process, or covered by the restored checkpoint:
  `covered_ids`) is acked again at once, as is a second trajectory for an already filled
  sample slot (counted as malformed): neither carries anything new.
- A trajectory whose group disagrees about its size is malformed input: terminated, counted.
- A trajectory of another run (its task id lacks this run's id: a straggler that an earlier
  run's actor finished after a fresh learner took the namespace over) is terminated and
  counted with the malformed: nothing of this run's books, and not trained on.
- Handled ids are remembered for one checkpoint after the one that acked them (by then
  every copy that was in flight has arrived; later, none can): the set stays bounded by
  what two checkpoints cover instead of growing with the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import nats.errors

from broker.trajectories import ReceivedTrajectory, TrajectoryConsumer
from learner.batching import Group, GroupAssembler
from learner.dispatcher import run_of

log = logging.getLogger(__name__)

ACK_CONCURRENCY = 256


class Intake:
    def __init__(
        self,
        consumer: TrajectoryConsumer,
        *,
        covered_ids: Iterable[str] = (),
        on_eval_group: Callable[[Group], None],
        run_id: str | None = None,
        fetch_batch: int = 256,
        fetch_timeout_s: float = 0.25,
    ) -> None:
        self.consumer = consumer
        self.on_eval_group = on_eval_group
        self.task_prefix = None if run_id is None else f"{run_id}-"
        """Every task id of this run starts with it (learner/dispatcher.py)."""
        self.fetch_batch = fetch_batch
        self.fetch_timeout_s = fetch_timeout_s
        covered = set(covered_ids)
        self.train = GroupAssembler(seen_ids=set(covered))
        self.evals = GroupAssembler(seen_ids=set(covered))
        self.groups: asyncio.Queue[Group] = asyncio.Queue()
        self._held: dict[str, list[ReceivedTrajectory]] = {}
        self._new_eval_ids: list[str] = []
        self._forget_at_next_ack = covered
        self.num_received = 0
        self.num_redelivered = 0
        self.num_slot_duplicates = 0
        self.num_invalid = 0
        self.num_other_run = 0
        self._other_runs: set[str] = set()

    @property
    def num_held(self) -> int:
        return len(self._held)

    @property
    def num_malformed(self) -> int:
        """Messages taken off the stream as bad input: invalid (terminated), undecodable
        (terminated by the consumer), a second trajectory for a filled sample slot, or
        another run's."""
        return (
            self.num_invalid
            + self.num_slot_duplicates
            + self.consumer.num_corrupt
            + self.num_other_run
        )

    def take_eval_ids(self) -> list[str]:
        """Eval trajectory ids received since the last call (the loop's checkpoint counts
        and acks them)."""
        ids, self._new_eval_ids = self._new_eval_ids, []
        return ids

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
        trajectory_id = trajectory.trajectory_id
        self.num_received += 1
        if self.task_prefix and not trajectory.group_id.startswith(self.task_prefix):
            await self._drop_other_run(received)
            return
        if trajectory_id in self._held:
            self.num_redelivered += 1
            self._held[trajectory_id].append(received)
            return
        assembler = self.evals if trajectory.is_eval else self.train
        if trajectory_id in assembler.seen_ids:  # acked already, or covered by the checkpoint
            self.num_redelivered += 1
            await _quietly(received.ack(), trajectory_id)
            return
        try:
            group = assembler.add(trajectory)
        except ValueError as e:  # malformed input (group size disagrees): never usable
            self.num_invalid += 1
            log.error("terminating invalid trajectory: %s", e)
            await _quietly(received.msg.term(), trajectory_id)
            return
        if trajectory_id not in assembler.seen_ids:  # its sample slot was already filled
            self.num_slot_duplicates += 1
            await _quietly(received.ack(), trajectory_id)
            return
        self._held[trajectory_id] = [received]
        if trajectory.is_eval:
            self._new_eval_ids.append(trajectory_id)
            if group is not None:
                self.on_eval_group(group)
        elif group is not None:
            self.groups.put_nowait(group)

    async def _drop_other_run(self, received: ReceivedTrajectory) -> None:
        self.num_other_run += 1
        task_id = received.trajectory.group_id
        run = run_of(task_id)
        if run not in self._other_runs:  # once per run: a straggling actor sends many
            self._other_runs.add(run)
            log.warning(
                "dropping trajectories of task %s and others like it: not of this run "
                "(%s), a straggler of an earlier run in this namespace",
                task_id,
                self.task_prefix[:-1],
            )
        await _quietly(received.msg.term(), received.trajectory.trajectory_id)

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
        # Copies of what the previous checkpoint acked were in flight at most until now.
        for assembler in (self.train, self.evals):
            assembler.forget(self._forget_at_next_ack)
        self._forget_at_next_ack = {i for i in ids if i not in failed}
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
