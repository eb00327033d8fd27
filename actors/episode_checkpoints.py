"""One prompt task's episode checkpoints, as the actor loop keeps them so that an episode
outlives its replica: recalled when the task comes back from a replica that died, recorded
after each turn that does not end an episode, marked stored with each trajectory, and
forgotten when the task is acked.
The broker side is broker/episodes.py; what a checkpoint holds and when it may be continued
is actors/resume.py. Without a store (`actor.episode_checkpoints = false`) every call is a
no-op and a redelivered task is played from its start.

Recording never holds an episode up: the checkpoint is taken at the turn boundary and put
in the background while the next turn generates (a broker that is restarting would
otherwise add its timeout to every turn). A sample has at most one put in flight; a newer
checkpoint replaces one still waiting. Its stored mark, and the group's purge, wait for
those puts, so a late checkpoint never lands on top of them.
"""

from __future__ import annotations

import asyncio
import logging

from actors import metrics
from actors.episode import Episode
from actors.resume import checkpoint_of
from actors.types import EpisodeResult
from broker.episodes import EpisodeStore
from broker.wire import EpisodeCheckpoint, PromptTask

log = logging.getLogger(__name__)


class GroupCheckpoints:
    def __init__(self, store: EpisodeStore | None, task: PromptTask, actor_id: str) -> None:
        self.store, self.task, self.actor_id = store, task, actor_id
        self._newest: dict[int, EpisodeCheckpoint] = {}  # taken, not yet put, by sample
        self._writing: dict[int, asyncio.Task] = {}

    async def recall(self, *, redelivered: bool) -> dict[int, EpisodeCheckpoint]:
        """The checkpoints of a redelivered task by sample (a first delivery has none: no
        replica played it before)."""
        if self.store is None or not redelivered:
            return {}
        saved = await self.store.recall(self.task.task_id, self.task.group_size)
        if saved:
            stored = sum(c.stored for c in saved.values())
            metrics.EPISODE_RESUMES.labels("skipped").inc(stored)
            log.info("task %s came back: %d samples stored already, %d with a checkpoint",
                     self.task.task_id, stored, len(saved) - stored)  # fmt: skip
        return saved

    async def on_turn(self, index: int, episode: Episode) -> None:
        if self.store is None:
            return
        checkpoint = checkpoint_of(
            self.task,
            index,
            episode.result,
            episode.actions,
            episode.observations,
            actor_id=self.actor_id,
        )
        self._newest[index] = checkpoint
        writing = self._writing.get(index)
        if writing is None or writing.done():
            self._writing[index] = asyncio.create_task(self._write(index))

    async def _write(self, index: int) -> None:
        while (checkpoint := self._newest.pop(index, None)) is not None:
            recorded = await self.store.record(checkpoint)
            metrics.EPISODE_CHECKPOINTS.labels("recorded" if recorded else "failed").inc()

    async def _written(self, index: int) -> None:
        writing = self._writing.pop(index, None)
        if writing is not None:
            await writing

    async def stored(self, index: int, result: EpisodeResult) -> None:
        """Sample `index`'s trajectory is on the stream; count how its checkpoint served."""
        if result.resumed_turns:
            metrics.EPISODE_RESUMES.labels("resumed").inc()
        elif result.resume_refused:
            metrics.EPISODE_RESUMES.labels(result.resume_refused).inc()
        if self.store is not None:
            await self._written(index)
            await self.store.mark_stored(self.task.task_id, index, self.actor_id)

    async def settle(self) -> None:
        """Wait for the puts in flight (the task goes back to the broker: another replica
        continues from what they record)."""
        for index in list(self._writing):
            await self._written(index)

    async def forget(self) -> None:
        if self.store is not None:
            await self.settle()
            await self.store.forget(self.task.task_id)
