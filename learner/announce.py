"""What the learner tells the actors about its policy (the policy-version KV), and its half
of the snapshot fallback.

Every new version is announced with the snapshot an engine can load instead of a broadcast
round (`PolicyVersion.snapshot_path`/`snapshot_version`) and the learner's lineage (actors
whose weights are ahead of a resumed learner roll back to its snapshot).

The fallback, end to end (docs/weights.md, "Missing a round"): rank 0 writes snapshots
(learner/trainer/ranks.py, every `snapshot_interval` versions and on demand); this module
decides when one is needed on demand and announces it; an engine that missed a round loads
the announced snapshot (actors/, weights/formats/snapshot.py). On demand means: the learner is
waiting for data with no snapshot of its current version, and either it has waited
`stall_snapshot_s`, or an engine of the broadcast did not get the current version's round.
That engine may be waiting for this very version, which only the learner's next round,
after its own data, would bring.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from broker.client import PolicyStore
from broker.wire import PolicyVersion
from learner.trainer.ranks import RankCommands

log = logging.getLogger(__name__)


class PolicyAnnouncer:
    def __init__(
        self,
        policy: PolicyStore,
        commands: RankCommands,
        *,
        initial_weights: str,
        lineage: str,
        stall_snapshot_s: float,
    ) -> None:
        self.policy = policy
        self.commands = commands
        self.initial_weights = Path(initial_weights).resolve()
        self.lineage = lineage
        self.stall_snapshot_s = stall_snapshot_s

    async def announce(self, version: int) -> None:
        """Publish `version` with the snapshot to announce beside it."""
        snapshot = self.commands.snapshot
        if snapshot is None and version == 0:
            # The initial weights are version 0's snapshot: an actor left with weights of
            # a lost history (a learner that died before its first checkpoint) reloads them.
            snapshot = (self.initial_weights, 0)
        await self.policy.publish(
            PolicyVersion(
                version=version,
                published_at=time.time(),
                snapshot_path=str(snapshot[0]) if snapshot else "",
                snapshot_version=snapshot[1] if snapshot else -1,
                broadcast_addr=self.commands.broadcast_addr,
                lineage=self.lineage,
                deltas_path=self.commands.deltas_path,
            )
        )

    async def waiting_for_data(self, version: int, *, idle_s: float) -> None:
        """Called while no data comes: snapshot `version` when waiting has lasted or an
        engine missed its round (nothing to do when the snapshot is current)."""
        if idle_s >= self.stall_snapshot_s or await asyncio.to_thread(self.commands.engines_behind):
            await self._snapshot_if_behind(version)

    async def _snapshot_if_behind(self, version: int) -> None:
        snapshot = self.commands.snapshot
        # Version 0 needs none: every engine starts from the model the learner started from.
        if version > 0 and (snapshot is None or snapshot[1] < version):
            log.warning("waiting for data at v%d: writing a snapshot of it", version)
            await asyncio.to_thread(self.commands.snapshot_current)
            await self.announce(version)
